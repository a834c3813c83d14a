"""TGI's own clients against the whole stack: the `text-generation` client (generate,
generate_stream, details) and huggingface_hub's InferenceClient.text_generation get HF's
greedy text in TGI's shapes; /info answers; /generate keeps LightLLM's shapes for
LightLLM's bodies. Every client talks to 127.0.0.1 only."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests import hf_reference
from tools.stack import Stack

text_generation = pytest.importorskip("text_generation")  # requirements-tgi.txt (installed without deps)
hub = pytest.importorskip("huggingface_hub")

PROMPT = "Once upon a time there was a small town by the sea."
NEW = 12


def _want(stack: Stack, prompt: str = PROMPT, new: int = NEW) -> tuple[list[int], list[int], str]:
    """(prompt ids, HF's greedy ids, their text) for the stack's model."""
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok(prompt)["input_ids"]
    out = hf_reference.greedy(stack.model_dir, ids, new)
    return ids, out, tok.decode(out, skip_special_tokens=True)


def _client(stack: Stack) -> text_generation.Client:
    return text_generation.Client(stack.url, timeout=60)


def test_text_generation_generate_is_hf_greedy_in_tgi_shape(stack: Stack) -> None:
    prompt_ids, ids, text = _want(stack)
    r = _client(stack).generate(PROMPT, max_new_tokens=NEW, decoder_input_details=True)
    assert r.generated_text == text
    d = r.details
    assert [t.id for t in d.tokens] == ids and d.generated_tokens == len(ids)
    assert all(t.logprob is not None and t.logprob <= 0 for t in d.tokens)
    assert d.finish_reason.value == ("length" if len(ids) == NEW else "eos_token")
    assert [t.id for t in d.prefill] == prompt_ids and d.seed is None
    # each prompt token after the first with HF's logprob of it under teacher forcing
    want = hf_reference.prompt_logprobs(stack.model_dir, prompt_ids)
    chosen = want.gather(1, torch.tensor(prompt_ids[1:])[:, None]).squeeze(1).tolist()
    assert d.prefill[0].logprob is None
    assert [t.logprob for t in d.prefill[1:]] == pytest.approx(chosen, abs=1e-3)


def test_text_generation_stream_is_hf_greedy_in_tgi_shape(stack: Stack) -> None:
    _, ids, text = _want(stack)
    events = list(_client(stack).generate_stream(PROMPT, max_new_tokens=NEW))
    assert [e.token.id for e in events] == ids
    assert "".join(e.token.text for e in events) == text
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.generated_text == text
    assert last.details.generated_tokens == len(ids)


def test_text_generation_stop_full_text_and_top_tokens(stack: Stack) -> None:
    _, ids, text = _want(stack)
    stop = text.strip()[3:6]
    r = _client(stack).generate(
        PROMPT, max_new_tokens=NEW, stop_sequences=[stop], return_full_text=True, top_n_tokens=2
    )
    assert r.generated_text == PROMPT + text[: text.index(stop)]
    assert r.details.finish_reason.value == "stop_sequence"
    assert r.details.top_tokens and all(len(alts) == 2 for alts in r.details.top_tokens)
    assert r.details.top_tokens[0][0].id == ids[0]


def test_inference_client_text_generation(stack: Stack) -> None:
    _, ids, text = _want(stack)
    client = hub.InferenceClient(model=stack.url, timeout=60)
    assert client.text_generation(PROMPT, max_new_tokens=NEW) == text
    out = client.text_generation(PROMPT, max_new_tokens=NEW, details=True)
    assert out.generated_text == text and [t.id for t in out.details.tokens] == ids
    assert "".join(client.text_generation(PROMPT, max_new_tokens=NEW, stream=True)) == text
    streamed = list(client.text_generation(PROMPT, max_new_tokens=NEW, stream=True, details=True))
    assert streamed[-1].generated_text == text and streamed[-1].details.generated_tokens == len(ids)


def test_info_and_generate_routes_by_dialect(stack: Stack) -> None:
    _, ids, text = _want(stack)
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        info = http.get("/info").json()
        assert info["model_id"] == stack.model_name and info["max_total_tokens"] > info["max_input_tokens"] > 0
        tgi = http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": NEW, "details": True}})
        assert tgi.json()["generated_text"] == text and len(tgi.json()["details"]["tokens"]) == len(ids)
        lightllm = http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": NEW}}).json()
        assert lightllm["generated_text"] == [text] and lightllm["count_output_tokens"] == len(ids)


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"watermark": True}, "watermark"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"grammar": {"type": "json", "value": 5}}, "grammar"),
        ({"best_of": 2}, "best_of"),
        ({"top_n_tokens": 21}, "parameters.top_n_tokens"),
        ({"stop_sequences": ["x"], "details": None}, "parameters.stop_sequences: unknown parameter"),
    ],
)
def test_tgi_parameters_it_cannot_honour_are_named(stack: Stack, parameters: dict, named: str) -> None:
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        for path in ("/", "/generate", "/generate_stream"):
            r = http.post(path, json={"inputs": "hi", "parameters": {"details": True, **parameters}})
            assert r.status_code == 400 and named in r.json()["error"], (path, r.text)
