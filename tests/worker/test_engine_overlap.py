"""The overlapped step loop: seeded sampling through the engine, aborts and ends while a step is in flight."""

from __future__ import annotations

from services.worker.build import build_engine
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run


def test_seeded_requests_do_not_depend_on_their_company(tiny_qwen: str) -> None:
    tok = hf_reference.tokenizer(tiny_qwen)
    ids = tok("The children ran along the beach")["input_ids"]
    params = {
        "max_new_tokens": 24,
        "do_sample": True,
        "temperature": 1.3,
        "top_p": 0.95,
        "seed": 11,
        "ignore_eos": True,
    }
    alone = run(build_engine(WorkerConfig(model_dir=tiny_qwen)), [request("x", ids, **params)])["x"].tokens
    crowd = [
        request(f"o{i}", tok("noise " * (i + 1))["input_ids"], max_new_tokens=30, do_sample=True, seed=i)
        for i in range(5)
    ]
    together = run(build_engine(WorkerConfig(model_dir=tiny_qwen)), [*crowd, request("x", ids, **params)])
    assert together["x"].tokens == alone
    other_seed = run(build_engine(WorkerConfig(model_dir=tiny_qwen)), [request("x", ids, **{**params, "seed": 12})])
    assert other_seed["x"].tokens != alone


def test_logprobs_come_with_their_tokens(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    out = run(engine, [request("a", [0, 5, 6, 7], max_new_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=2)])
    a = out["a"]
    assert len(a.tokens) == 6 and len(a.logprobs) == 6
    assert all(lp <= 0.0 for lp in a.logprobs)


def test_abort_while_a_step_is_in_flight(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    engine.add(request("a", list(range(3, 30)), max_new_tokens=40, ignore_eos=True))
    engine.add(request("b", list(range(3, 20)), max_new_tokens=5, ignore_eos=True))
    seen: dict[str, list] = {"a": [], "b": []}
    ends: dict[str, str] = {}
    for step in range(200):
        if step == 4:
            assert engine.inflight is not None  # a step is launched and not yet collected
            assert engine.abort("a")
        if not engine.has_work():
            break
        for _, item in engine.step().items:
            seen[item.rid] += item.token_ids
            if item.finish_reason:
                ends[item.rid] = item.finish_reason
    assert ends == {"a": "abort", "b": "length"}
    assert len(seen["b"]) == 5
    assert len(seen["a"]) < 40
    assert (
        engine.kv.available_tokens == engine.kv.capacity and engine.kv.table.num_free_rows == engine.kv.table.max_rows
    )


def test_an_end_token_finishes_the_request_despite_the_step_in_flight(tiny_llama: str) -> None:
    """The step after an EOS is already launched when the EOS is seen: its token is dropped."""
    tok = hf_reference.tokenizer(tiny_llama)
    candidates = ["def f(x): return", "Hello world", "def greet(name):\n    return", "x", "a b c", "Question:"]
    runs = [(ids, hf_reference.greedy(tiny_llama, ids, 40)) for ids in (tok(t)["input_ids"] for t in candidates)]
    ended = [(ids, want) for ids, want in runs if len(want) < 40]
    assert ended, "no candidate prompt ends on EOS with the tiny model"
    ids, want = ended[0]
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    got = run(engine, [request("e", ids, max_new_tokens=40)])["e"]
    assert got.tokens == want and got.finish_reason == "stop"
    assert engine.kv.available_tokens == engine.kv.capacity
