"""Structured output in the engine: outputs that hold to their JSON schema, regex or choice list,
the same tokens as a plain loop that masks Hugging Face's logits with the same grammar, free
requests untouched by constrained company, and grammars compiled once, off the step loop."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import replace

import jsonschema
import pytest
import torch
import xgrammar as xgr

from services.worker.build import build_engine
from services.worker.engine import Engine
from shared.config import WorkerConfig
from shared.messages import ERR_INVALID, Constraint
from tests import hf_reference
from tests.structured_cases import CHOICES, REGEXES, SCHEMAS
from tests.worker.engine_driver import request, run

PROMPTS = ["Answer in JSON.", "The weather today", "x"]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request: pytest.FixtureRequest, tiny_models: dict[str, str]) -> tuple[str, Engine]:
    """A tiny model and one engine of it for the module (outputs do not depend on what ran before)."""
    path = tiny_models[request.param]
    return path, build_engine(WorkerConfig(model_dir=path))


def _ids(model_dir: str, i: int) -> list[int]:
    return hf_reference.tokenizer(model_dir)(PROMPTS[i % len(PROMPTS)])["input_ids"]


def _text(model_dir: str, tokens: list[int]) -> str:
    return hf_reference.tokenizer(model_dir).decode(tokens, skip_special_tokens=True)


def test_every_output_holds_to_its_schema_regex_or_choice(model: tuple[str, Engine]) -> None:
    path, engine = model
    cases = [("json_schema", json.dumps(s)) for s in SCHEMAS]
    cases += [("regex", r) for r in REGEXES] + [("choice", json.dumps(c)) for c in CHOICES]
    reqs = [request(f"q{i}", _ids(path, i), max_new_tokens=200, constraint=Constraint(*c)) for i, c in enumerate(cases)]
    out = run(engine, reqs)
    for i, (kind, text) in enumerate(cases):
        got = out[f"q{i}"]
        assert got.finish_reason == "stop", (kind, text, got)
        answer = _text(path, got.tokens)
        if kind == "json_schema":
            jsonschema.validate(json.loads(answer), json.loads(text))
        elif kind == "regex":
            assert re.fullmatch(text, answer), (text, answer)
        else:
            assert answer in json.loads(text)


def _masked_greedy(model_dir: str, ids: list[int], compiled: xgr.CompiledGrammar, limit: int) -> list[int]:
    """Hugging Face's model, a whole forward per token, its logits masked by the grammar."""
    _, hf = hf_reference._load(model_dir)
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, hf.config.vocab_size)
    out: list[int] = []
    while len(out) < limit and not matcher.is_terminated():
        with torch.no_grad():
            logits = hf(torch.tensor([ids + out])).logits[:, -1].float()  # [1, V]
        matcher.fill_next_token_bitmask(mask)
        xgr.apply_token_bitmask_inplace(logits, mask)
        out.append(int(logits.argmax()))
        assert matcher.accept_token(out[-1])
    return out


def test_masks_follow_every_token_though_steps_overlap(model: tuple[str, Engine]) -> None:
    """Each step's mask is made from the token of the step before, still in flight when the
    step was planned: the outputs equal a loop that runs one token at a time. The constrained
    requests decode in every step: they end within their token count's steps."""
    path, engine = model
    cases = [Constraint("json_schema", json.dumps(SCHEMAS[i])) for i in (6, 11, 19)]
    cases += [Constraint("regex", REGEXES[9]), Constraint("choice", json.dumps(CHOICES[16]))]
    cases += [Constraint("grammar", 'root ::= "(" [0-9]{1,3} (", " [0-9]{1,3})* ")"')]
    compiled = [engine.grammars.state(c, 0).future.result() for c in cases]  # so all start in one step
    reqs = [request(f"m{i}", _ids(path, i), max_new_tokens=120, constraint=c) for i, c in enumerate(cases)]
    steps = engine.steps
    out = run(engine, reqs)
    for i, c in enumerate(cases):
        assert out[f"m{i}"].tokens == _masked_greedy(path, reqs[i].input_ids, compiled[i], 120), c
    # launches: one per token of the longest, and one whose token came after its end
    assert engine.steps - steps <= max(len(o.tokens) for o in out.values()) + 1
    assert engine.scheduler.constrained == 0  # none held: the next steps make no mask


def test_free_requests_are_unchanged_by_constrained_company(model: tuple[str, Engine]) -> None:
    path, engine = model
    free = [
        request("greedy", _ids(path, 1), max_new_tokens=24, ignore_eos=True),
        request("sampled", _ids(path, 2), max_new_tokens=24, do_sample=True, temperature=0.9, seed=7),
    ]
    alone = run(engine, free)
    company = [
        request(f"c{i}", _ids(path, i), max_new_tokens=80, constraint=Constraint("json_schema", json.dumps(s)))
        for i, s in enumerate(SCHEMAS[:4])
    ]
    together = run(engine, [*company, *free])
    for r in free:
        assert together[r.rid].tokens == alone[r.rid].tokens
    assert all(together[r.rid].finish_reason == "stop" for r in company)


def test_the_grammar_ends_the_output_even_with_ignore_eos(model: tuple[str, Engine]) -> None:
    path, engine = model
    c = Constraint("choice", json.dumps(["positive", "negative"]))
    out = run(engine, [request("e", _ids(path, 0), max_new_tokens=50, ignore_eos=True, constraint=c)])["e"]
    assert out.finish_reason == "stop" and _text(path, out.tokens) in ("positive", "negative")
    assert len(out.tokens) < 50


@pytest.mark.parametrize(
    ("kind", "text", "says"),
    [
        ("regex", "[a-", "regex: Regex parsing error at position 4: Unclosed '['"),
        ("json_schema", '{"type": "foo"}', 'json_schema: Unsupported type "foo"'),
        ("json_schema", "{not json", "json_schema: Failed to parse JSON"),
        ("json_schema", '{"type": "integer", "minimum": 5, "maximum": 1}', "minimum greater than maximum"),
        ("json_schema", '{"type": "array", "uniqueItems": true}', "json_schema: the keyword 'uniqueItems' (at #)"),
        ("choice", "[]", "choice: must be a non-empty array"),
        ("grammar", 'root ::= "a" | b', "grammar: "),
    ],
)
def test_a_constraint_that_does_not_compile_fails_only_its_request(
    model: tuple[str, Engine], kind: str, text: str, says: str
) -> None:
    path, engine = model
    bad = request("bad", _ids(path, 0), max_new_tokens=8, constraint=Constraint(kind, text))
    out = run(engine, [bad, request("fine", _ids(path, 1), max_new_tokens=8, ignore_eos=True)])
    assert out["bad"].finish_reason == "error" and says in out["bad"].error and not out["bad"].tokens
    assert len(out["fine"].tokens) == 8


def test_grammars_compile_once_in_their_thread_while_the_steps_go_on(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    grammars = engine.grammars
    release, compiled = threading.Event(), []
    make = grammars._compile

    def slow_compile(c: Constraint) -> xgr.CompiledGrammar:
        release.wait(30)
        compiled.append(c)
        return make(c)

    grammars._compile = slow_compile  # type: ignore[method-assign]
    c = Constraint("regex", "[0-9]{3}")
    engine.add(request("c1", [0, 5, 6], max_new_tokens=10, constraint=c))
    engine.add(request("c2", [0, 7, 8], max_new_tokens=10, constraint=c))
    engine.add(request("c3", [0, 7, 8], max_new_tokens=10, constraint=c))
    engine.add(request("free", [0, 9, 10], max_new_tokens=4, ignore_eos=True))
    items = [item for _ in range(6) for _, item in engine.step().items]
    assert [i.rid for i in items if i.token_ids] == ["free"] * 4 and items[-1].finish_reason == "length"
    assert engine.compiling() and not engine.has_work()
    assert set(engine.running_reqs().rids) == {"c1", "c2", "c3"}  # the router still counts them
    assert engine.abort("c3")
    release.set()
    out = run(engine, [])
    assert compiled == [c]  # one compile for the three
    assert out["c3"].finish_reason == "abort"
    for rid in ("c1", "c2"):
        assert out[rid].finish_reason == "stop" and re.fullmatch("[0-9]{3}", _text(tiny_llama, out[rid].tokens))
    assert engine.kv.available_tokens == engine.kv.capacity and engine.scheduler.constrained == 0


def test_steps_without_constrained_requests_make_no_mask(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    run(engine, [request("a", [0, 5, 6], max_new_tokens=6), request("b", [0, 7], max_new_tokens=6)])
    assert engine.masks is None


def test_the_mask_is_filled_while_the_step_loop_launches_the_forward(tiny_llama: str) -> None:
    """The fill runs in the mask thread, beside the forward's launch (which on the CPU is its run),
    and the step waits for it before sampling."""
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    spans: dict[str, list[tuple[float, float, str]]] = {"fill": [], "forward": []}

    def timed(name: str, f):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spans[name].append((started, time.perf_counter(), threading.current_thread().name))

        return call

    forward = engine.runner.forward
    engine.runner.forward = timed("forward", lambda batch: (time.sleep(0.05), forward(batch))[1])  # type: ignore[method-assign]
    c = Constraint("regex", "[0-9]{6}")
    run(engine, [request("a", [0, 5, 6], max_new_tokens=8, constraint=c)])  # makes the masks
    assert engine.masks is not None
    fill = engine.masks._fill
    engine.masks._fill = timed("fill", lambda *a: (time.sleep(0.03), fill(*a))[1])  # type: ignore[method-assign]
    out = run(engine, [request("b", [0, 5, 7], max_new_tokens=8, constraint=c)])["b"]
    assert out.finish_reason == "stop" and re.fullmatch("[0-9]{6}", _text(tiny_llama, out.tokens))
    fills = spans["fill"]
    assert len(fills) >= 6 and all(name.startswith("token-mask") for _, _, name in fills)
    # each fill overlaps a forward in the step loop's thread, and the sampling waits for it
    forwards = spans["forward"][-len(fills) :]
    assert all(name == threading.current_thread().name for _, _, name in forwards)
    for (fill_start, fill_end, _), (fwd_start, fwd_end, _) in zip(fills, forwards, strict=True):
        assert fill_start < fwd_end and fwd_start < fill_end


def test_the_step_loop_collects_and_plans_while_the_fill_goes_on(tiny_llama: str) -> None:
    """A step with constrained requests is left staged: step() returns with its fill still going
    on (the worker publishes and reads its inbox meanwhile), and the next step() waits for the
    mask before sampling it; the output is the same as with a fill that never keeps it waiting."""
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    c = Constraint("regex", "[0-9]{6}")
    quick = run(engine, [request("a", [0, 5, 6], max_new_tokens=8, constraint=c)])["a"]
    assert engine.masks is not None
    chunk, step = engine.masks._fill_chunk, engine.step
    gate = threading.Event()
    engine.masks._fill_chunk = lambda *a: (gate.wait(30), chunk(*a))[1]  # type: ignore[method-assign]
    returned_while_filling = []

    def gated_step():
        gate.clear()
        threading.Timer(0.05, gate.set).start()
        out = step()
        staged = engine.staged
        returned_while_filling.append(staged is not None and staged.filling is not None and not gate.is_set())
        gate.wait(30)
        return out

    engine.step = gated_step  # type: ignore[method-assign]
    slow = run(engine, [request("b", [0, 5, 6], max_new_tokens=8, constraint=c)])["b"]
    assert (slow.tokens, slow.finish_reason) == (quick.tokens, quick.finish_reason) and quick.finish_reason == "stop"
    assert sum(returned_while_filling) >= 5, returned_while_filling


def test_an_abort_while_a_constrained_step_is_staged_frees_everything(tiny_llama: str) -> None:
    """A request aborted while the step it is in waits for its mask ends with "abort" and no
    token after; one beside it ends as it would have, and the pool is whole again."""
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    c = Constraint("regex", "[0-9]{60}")
    alone = run(engine, [request("b", [0, 7, 8], max_new_tokens=40, constraint=c)])["b"]
    engine.add(request("a", [0, 5, 6], max_new_tokens=40, constraint=c))
    engine.add(request("b", [0, 7, 8], max_new_tokens=40, constraint=c))
    seen: dict[str, list[int]] = {"a": [], "b": []}
    ends: dict[str, str] = {}
    for step in range(200):
        if step == 6:
            assert engine.staged is not None  # launched, its sampling waiting for the mask
            assert engine.abort("a")
        if not engine.has_work():
            break
        for _, item in engine.step().items:
            assert item.rid not in ends, "a token after the end"
            seen[item.rid] += item.token_ids
            if item.finish_reason:
                ends[item.rid] = item.finish_reason
    assert ends == {"a": "abort", "b": "length"}
    assert seen["b"] == alone.tokens and 0 < len(seen["a"]) < 40
    assert engine.staged is None and engine.inflight is None
    assert engine.kv.available_tokens == engine.kv.capacity
    assert engine.kv.table.num_free_rows == engine.kv.table.max_rows


def test_a_failed_forward_does_not_wait_for_its_fill(tiny_llama: str) -> None:
    """The fill may wait for a step the device never ends (a tensor-parallel peer died in its
    all-reduce): the step's forward failing ends the step at once."""
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    engine.add(request("a", [0, 5, 6], max_new_tokens=8, constraint=Constraint("regex", "[0-9]{6}")))
    while engine.masks is None:
        engine.step()
    stuck = threading.Event()
    fill = engine.masks._fill
    engine.masks._fill = lambda *a: (stuck.wait(30), fill(*a))[1]  # type: ignore[method-assign]

    def dead(batch):
        raise RuntimeError("a rank died")

    engine.runner.forward = dead  # type: ignore[method-assign]
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="a rank died"):
        engine.step()
    assert time.perf_counter() - started < 5
    stuck.set()


def test_an_invalid_constraint_is_an_invalid_request(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    engine.add(request("bad", [0, 5], constraint=Constraint("regex", "(")))
    items = []
    while engine.compiling() or engine.has_work():
        items += [item for _, item in engine.step().items]
    assert [(i.finish_reason, i.error_kind) for i in items] == [("error", ERR_INVALID)]


def test_min_tokens_past_the_formats_end_is_an_invalid_request(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    c = Constraint("choice", '["yes", "no"]')
    out = run(engine, [request("m", [0, 5, 6], max_new_tokens=20, min_new_tokens=10, constraint=c)])["m"]
    assert out.finish_reason == "error" and "min_tokens" in out.error


def test_a_format_after_the_thinking_leaves_the_thinking_free(model: tuple[str, Engine]) -> None:
    """after_token (a reasoning model's </think>): free text up to and including it, the format
    from the next token on."""
    path, engine = model
    ids = _ids(path, 1)
    free = run(engine, [request("free", ids, max_new_tokens=12, ignore_eos=True)])["free"].tokens
    k = 3
    end_of_thinking = free[k]
    k = free.index(end_of_thinking)  # its first appearance
    c = Constraint("regex", REGEXES[0], after_token=end_of_thinking)
    out = run(engine, [request("t", ids, max_new_tokens=60, ignore_eos=True, constraint=c)])["t"]
    assert out.tokens[: k + 1] == free[: k + 1] and out.finish_reason == "stop"
    assert re.fullmatch(REGEXES[0], _text(path, out.tokens[k + 1 :]))
    # handed over inside the thinking and inside the answer: the grammar takes in the output it
    # had (free text, the end of the thinking, the answer so far), and the rest is the same
    assert k + 2 < len(out.tokens)
    for cut in (k, k + 2):
        msg = request(f"t{cut}", ids + out.tokens[:cut], max_new_tokens=60, ignore_eos=True, constraint=c)
        rest = run(engine, [replace(msg, resumed=cut)])[msg.rid]
        assert out.tokens[:cut] + rest.tokens == out.tokens and rest.finish_reason == "stop", (cut, rest)


@pytest.mark.parametrize("kind", ["json_schema", "regex"])
def test_a_handed_over_request_goes_on_from_the_output_it_had(model: tuple[str, Engine], kind: str) -> None:
    """A request handed over from a dead group arrives with its output so far among its input
    ids (GenerateReq.resumed): its grammar takes that output in before its first mask, so the
    rest of the output is what the unbroken request gave, and the whole holds to the format."""
    path, engine = model
    constraint = Constraint(kind, json.dumps(SCHEMAS[0]) if kind == "json_schema" else REGEXES[0])
    ids = _ids(path, 0)
    whole = run(engine, [request("whole", ids, max_new_tokens=200, constraint=constraint)])["whole"]
    assert whole.finish_reason == "stop" and len(whole.tokens) > 4
    for k in (1, len(whole.tokens) // 2):
        msg = replace(
            request(f"resumed{k}", ids + whole.tokens[:k], max_new_tokens=200, constraint=constraint), resumed=k
        )
        rest = run(engine, [msg])[msg.rid]
        assert rest.finish_reason == "stop" and whole.tokens[:k] + rest.tokens == whole.tokens, (k, rest)
