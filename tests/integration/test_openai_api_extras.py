"""The OpenAI routes with what SDKs and vLLM clients send beyond OpenAI's core: fields that
change nothing are accepted (parallel_tool_calls, store, service_tier, user, metadata), and
vLLM's include_stop_str_in_output, min_tokens and continuous_usage_stats change the output as
vLLM's do, against Hugging Face's greedy output."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from tests import hf_reference
from tests.integration.openai_helpers import (  # noqa: F401 (_stack: a fixture)
    KEY,
    _stack,
    sync_client,
)
from tools.stack import Stack

PROMPT = "Once upon a time there was a small town by the sea."
# greedy ends on EOS within 40 tokens for one of these, for each tiny model
EOS_CANDIDATES = ["Mathematics is the study of numbers, shapes and patterns. One plus one is", "x", "a b c"]
NO_OPS = {
    "parallel_tool_calls": False,
    "store": False,
    "service_tier": "auto",
    "user": "u-1",
    "metadata": {"team": "a"},
}


def _hf_text(
    stack: Stack,
    prompt: str,
    new: int,
    min_new: int = 0,
    bias: dict[int, float] | None = None,
    allowed: list[int] | None = None,
) -> tuple[list[int], str]:
    """Greedy ids and text from Hugging Face; bias: added to those tokens' logits (sequence_bias);
    allowed: the only tokens it may choose (prefix_allowed_tokens_fn)."""
    tok, model = hf_reference._load(stack.model_dir)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=min_new,
            do_sample=False,
            pad_token_id=model.config.vocab_size - 1,
            sequence_bias={(t,): b for t, b in bias.items()} if bias else None,
            prefix_allowed_tokens_fn=(lambda _batch, _ids: allowed) if allowed else None,
        )
    got = out[0, ids.shape[1] :].tolist()
    return got, tok.decode(got, skip_special_tokens=True)


def test_fields_that_change_nothing_are_accepted(stack: Stack) -> None:
    client = sync_client(stack)
    _, want = _hf_text(stack, PROMPT, 8)
    whole = client.completions.create(
        model=stack.model_name, prompt=PROMPT, max_tokens=8, temperature=0, extra_body=NO_OPS
    )
    assert whole.choices[0].text == want
    chat = client.chat.completions.create(
        model=stack.model_name,
        messages=[{"role": "user", "content": "Hello"}],
        max_completion_tokens=4,
        **NO_OPS,
    )
    assert chat.choices[0].message.content is not None


def test_tool_choice_auto_without_a_parser_is_refused_by_name(stack: Stack) -> None:
    """This stack has no --tool-call-parser: it cannot read calls out of free text (tool_choice
    "required" and named ones, written by the grammar, work: test_tool_calls.py)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        sync_client(stack).chat.completions.create(
            model=stack.model_name, messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )
    no_arguments = {"type": "function", "function": {"name": "g"}}
    forced = sync_client(stack).chat.completions.create(
        model=stack.model_name,
        messages=[{"role": "user", "content": "hi"}],
        tools=[no_arguments],
        tool_choice="required",
        temperature=0,
        max_tokens=100,
    )
    assert [(c.function.name, c.function.arguments) for c in forced.choices[0].message.tool_calls] == [("g", "{}")]


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output(stack: Stack, stream: bool) -> None:
    _, text = _hf_text(stack, PROMPT, 16)
    stop = text.strip()[4:7]
    cut = text[: text.index(stop)]
    client = sync_client(stack)

    def complete(**extra) -> str:
        kw = {"model": stack.model_name, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": [stop]}
        if not stream:
            return client.completions.create(**kw, extra_body=extra).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True, extra_body=extra))

    assert complete() == cut
    assert complete(include_stop_str_in_output=True) == cut + stop


def test_min_tokens_holds_back_the_end_as_hf_does(stack: Stack) -> None:
    client = sync_client(stack)
    for prompt in EOS_CANDIDATES:
        ids, _ = _hf_text(stack, prompt, 40)
        if len(ids) < 40:
            break
    else:
        raise AssertionError("no candidate prompt ends on EOS")
    at_least = len(ids) + 3
    want_ids, want = _hf_text(stack, prompt, 40, min_new=at_least)
    got = client.completions.create(
        model=stack.model_name, prompt=prompt, max_tokens=40, temperature=0, extra_body={"min_tokens": at_least}
    )
    assert len(want_ids) >= at_least and got.choices[0].text == want
    assert got.usage.completion_tokens == len(want_ids)


def test_logit_bias_as_hf_sequence_bias(stack: Stack) -> None:
    """A ban of the first greedy token and a push toward another change the output as Hugging
    Face's sequence_bias does; on both routes, streamed and whole."""
    plain, _ = _hf_text(stack, PROMPT, 8)
    bias = {plain[0]: -100.0, plain[3]: 3.0}
    want_ids, want = _hf_text(stack, PROMPT, 8, bias=bias)
    assert want_ids != plain
    client = sync_client(stack)
    body = {"logit_bias": {str(t): b for t, b in bias.items()}}
    kw = {"model": stack.model_name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "extra_body": body}
    assert client.completions.create(**kw).choices[0].text == want
    assert "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True)) == want
    chat = client.chat.completions.create(
        model=stack.model_name,
        messages=[{"role": "user", "content": "Hello"}],
        max_completion_tokens=4,
        temperature=0,
        logit_bias={str(plain[0]): 100},  # as good as forced: every token is that one
    )
    tok = hf_reference.tokenizer(stack.model_dir)
    assert chat.choices[0].message.content == tok.decode([plain[0]] * 4, skip_special_tokens=True)


def test_allowed_token_ids_as_hf_prefix_allowed_tokens(stack: Stack) -> None:
    """vLLM's allowed_token_ids: greedy over those tokens only, as Hugging Face's
    prefix_allowed_tokens_fn chooses; the plain answer's tokens are left out but two."""
    plain, _ = _hf_text(stack, PROMPT, 6)
    allowed = sorted({plain[1], plain[3], 5, 9, 17})
    want_ids, want = _hf_text(stack, PROMPT, 6, allowed=allowed)
    assert set(want_ids) <= set(allowed)
    got = sync_client(stack).completions.create(
        model=stack.model_name,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        extra_body={"allowed_token_ids": allowed, "ignore_eos": True},
    )
    assert got.choices[0].text == want


def test_min_p_of_one_samples_the_greedy_text(stack: Stack) -> None:
    """vLLM's min_p: at 1 only the likeliest token survives, so a sampled completion (OpenAI's
    default temperature of 1) is Hugging Face's greedy text whatever the seed."""
    _, want = _hf_text(stack, PROMPT, 8)
    client = sync_client(stack)
    for seed in (1, 2):
        got = client.completions.create(
            model=stack.model_name, prompt=PROMPT, max_tokens=8, seed=seed, extra_body={"min_p": 1.0}
        )
        assert got.choices[0].text == want


def test_continuous_usage_stats_put_usage_in_every_chunk(stack: Stack) -> None:
    chunks = list(
        sync_client(stack).completions.create(
            model=stack.model_name,
            prompt=PROMPT,
            max_tokens=6,
            temperature=0,
            stream=True,
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
    )
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6


def test_include_stop_str_in_output_in_chat(stack: Stack) -> None:
    client = sync_client(stack)
    kw = {"model": stack.model_name, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}
    text = client.chat.completions.create(**kw, temperature=0).choices[0].message.content
    stop = text.strip()[2:4]
    kw |= {"temperature": 0, "stop": [stop]}
    cut = client.chat.completions.create(**kw).choices[0].message.content
    whole = client.chat.completions.create(**kw, extra_body={"include_stop_str_in_output": True})
    chunks = client.chat.completions.create(**kw, stream=True, extra_body={"include_stop_str_in_output": True})
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert cut == text[: text.index(stop)] and whole.choices[0].message.content == streamed == cut + stop


@pytest.mark.parametrize(("stream", "new"), [(False, 1), (True, 1), (False, 0), (True, 0)])
def test_echo_with_logprobs_scores_the_prompt_as_hf(stack: Stack, stream: bool, new: int) -> None:
    """echo with logprobs, as lm-eval's loglikelihood tasks send it (token ids, max_tokens 1; 0 in
    older clients: the prompt alone): one entry per prompt token then per output token; the first
    prompt token has no logprob, the others Hugging Face's log-softmax of them under teacher
    forcing, with their top alternatives."""
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok(PROMPT)["input_ids"]
    client = sync_client(stack)
    kw = {"model": stack.model_name, "prompt": ids, "max_tokens": new, "temperature": 0, "logprobs": 2, "echo": True}
    if stream:
        chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        got = {key: [] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        for c in chunks:
            if c.choices and c.choices[0].logprobs is not None:
                for key in got:
                    got[key] += getattr(c.choices[0].logprobs, key)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        use = chunks[-1].usage
    else:
        r = client.completions.create(**kw)
        lp = r.choices[0].logprobs
        got = {key: getattr(lp, key) for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        text, reason, use = r.choices[0].text, r.choices[0].finish_reason, r.usage
    assert text.startswith(tok.decode(ids)) and (new or text == tok.decode(ids))
    assert len(got["tokens"]) == len(ids) + new and got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    assert use.prompt_tokens == len(ids) and use.completion_tokens == new and reason == "length"
    want = hf_reference.prompt_logprobs(stack.model_dir, ids)
    chosen = want.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()
    assert got["token_logprobs"][1 : len(ids)] == pytest.approx(chosen, abs=1e-3)
    for i, top in enumerate(got["top_logprobs"][1 : len(ids)]):
        best = torch.topk(want[i], 2).values.tolist()
        assert max(top.values()) == pytest.approx(best[0], abs=1e-3) and len(top) <= 3
    assert got["text_offset"][0] == 0 and got["text_offset"] == sorted(got["text_offset"])
    if new:  # the output token's entry follows the prompt's, as without echo
        assert got["token_logprobs"][-1] is not None and got["text_offset"][-1] == len(tok.decode(ids))


def test_vllm_prompt_logprobs_in_each_choice(stack: Stack) -> None:
    """vLLM's prompt_logprobs: a choice's prompt_logprobs is null for the first prompt token, then
    for each token a map from token id to its logprob, rank and text, the token's own (HF's
    teacher-forced logprob) and its position's k most likely; streamed with the first chunk."""
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok(PROMPT)["input_ids"]
    want = hf_reference.prompt_logprobs(stack.model_dir, ids)
    body = {"model": stack.model_name, "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
    r = httpx.post(stack.url + "/v1/completions", json=body, headers=AUTH, timeout=60)
    whole = r.json()["choices"][0]["prompt_logprobs"]
    first = client_chunks(stack, {**body, "stream": True})[0]["choices"][0]["prompt_logprobs"]
    assert first == whole and whole[0] is None and len(whole) == len(ids)
    for i, (t, entry) in enumerate(zip(ids[1:], whole[1:], strict=True)):
        own = entry[str(t)]
        assert own["logprob"] == pytest.approx(float(want[i, t]), abs=1e-3) and own["decoded_token"] == tok.decode([t])
        assert own["rank"] == int((want[i] > want[i, t]).sum()) + 1
        top = torch.topk(want[i], 2)
        for rank, (tid, lp) in enumerate(zip(top.indices.tolist(), top.values.tolist(), strict=True), start=1):
            assert entry[str(tid)]["logprob"] == pytest.approx(lp, abs=1e-3) and entry[str(tid)]["rank"] == rank


def test_vllm_prompt_logprobs_of_a_chat(stack: Stack) -> None:
    """The chat route's prompt_logprobs (top level, of the rendered prompt) are HF's; with stream
    they are refused by name."""
    client = sync_client(stack)
    messages = [{"role": "user", "content": PROMPT}]
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    r = client.chat.completions.create(
        model=stack.model_name, messages=messages, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    got = r.model_extra["prompt_logprobs"]
    want = hf_reference.prompt_logprobs(stack.model_dir, ids)
    assert got[0] is None and len(got) == len(ids) == r.usage.prompt_tokens
    assert [got[i + 1][str(t)]["logprob"] for i, t in enumerate(ids[1:])] == pytest.approx(
        [float(want[i, t]) for i, t in enumerate(ids[1:])], abs=1e-3
    )
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=stack.model_name, messages=messages, stream=True, extra_body={"prompt_logprobs": 1}
        )
    assert e.value.body["param"] == "prompt_logprobs"


@pytest.mark.parametrize("continue_final", [True, False])
def test_chat_without_a_generation_prompt_as_hf(stack: Stack, continue_final: bool) -> None:
    """vLLM's add_generation_prompt false, and continue_final_message: the prompt is the template's
    rendering without the next turn's header (or left open inside the assistant's begun message),
    and the answer is Hugging Face's greedy continuation of exactly those tokens."""
    messages = [{"role": "user", "content": PROMPT}]
    if continue_final:
        messages.append({"role": "assistant", "content": "Once upon"})
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=continue_final, tokenize=True, return_dict=True
    )["input_ids"]
    want = tok.decode(hf_reference.greedy(stack.model_dir, ids, 6), skip_special_tokens=True)
    flags = {"add_generation_prompt": False, "continue_final_message": continue_final}
    client = sync_client(stack)
    r = client.chat.completions.create(
        model=stack.model_name, messages=messages, max_tokens=6, temperature=0, extra_body=flags
    )
    assert r.choices[0].message.content == want and r.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=stack.model_name, messages=messages, extra_body={"continue_final_message": True}
        )
    assert e.value.body["param"] == "continue_final_message"


def test_truncate_prompt_tokens_keeps_the_prompts_end(stack: Stack) -> None:
    """vLLM's truncate_prompt_tokens: the prompt's (or the rendered chat's) last k tokens are the
    prompt, as Hugging Face continues them; echo returns those k tokens' text."""
    tok = hf_reference.tokenizer(stack.model_dir)
    client = sync_client(stack)
    ids = tok(PROMPT)["input_ids"][-5:]
    want = tok.decode(hf_reference.greedy(stack.model_dir, ids, 6), skip_special_tokens=True)
    r = client.completions.create(
        model=stack.model_name,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        echo=True,
        extra_body={"truncate_prompt_tokens": 5},
    )
    assert r.choices[0].text == tok.decode(ids) + want and r.usage.prompt_tokens == 5
    messages = [{"role": "user", "content": PROMPT}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    ids = rendered["input_ids"][-7:]
    chat = client.chat.completions.create(
        model=stack.model_name,
        messages=messages,
        max_tokens=6,
        temperature=0,
        extra_body={"truncate_prompt_tokens": 7},
    )
    want = tok.decode(hf_reference.greedy(stack.model_dir, ids, 6), skip_special_tokens=True)
    assert chat.choices[0].message.content == want and chat.usage.prompt_tokens == 7


AUTH = {"Authorization": f"Bearer {KEY}"}


def client_chunks(stack: Stack, body: dict) -> list[dict]:
    """A streamed completion's chunks, as JSON."""
    with httpx.stream("POST", stack.url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]
