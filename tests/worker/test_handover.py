"""What a worker group's death hands over (docs/router.md, Failures): a request stays in the
group's status until its last item has gone out, and a request handed over with its output so
far goes on exactly where it stopped."""

from __future__ import annotations

import pytest

from services.worker.build import build_engine
from shared.config import WorkerConfig
from shared.messages import GenerateReq, SamplingParams
from tests.worker.engine_driver import request, run


def test_a_request_stays_in_the_status_until_its_last_item_is_out(tiny_llama: str) -> None:
    """The step that samples a request's last token frees its KV at launch; the token goes out
    when the next step collects it. A status sent in between must still list the request, or a
    router that loses the group then takes it for finished and nobody ever ends it."""
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    engine.add(request("a", [3, 4, 5, 6], max_new_tokens=4, ignore_eos=True))
    engine.add(request("b", list(range(3, 40)), max_new_tokens=9, ignore_eos=True))
    ended: set[str] = set()
    while engine.has_work():
        out = engine.step()
        ended |= {item.rid for _, item in out.items if item.finish_reason}
        listed = set(engine.running_reqs().rids)
        assert listed == {"a", "b"} - ended, (listed, ended)
    assert ended == {"a", "b"}


@pytest.mark.parametrize("sampling", [{}, {"do_sample": True, "temperature": 1.2, "seed": 7}], ids=["greedy", "seeded"])
def test_a_request_handed_over_with_its_output_goes_on_where_it_stopped(tiny_llama: str, sampling: dict) -> None:
    prompt = list(range(5, 25))
    params = {"max_new_tokens": 14, "ignore_eos": True, **sampling}
    whole = run(build_engine(WorkerConfig(model_dir=tiny_llama)), [request("r", prompt, **params)])["r"].tokens
    assert len(whole) == 14
    had = whole[:6]  # what the dead group's client had been sent
    resumed = GenerateReq("r", "front", "detok", prompt + had, SamplingParams(**params), 0.0, 0.0, len(had), 1)
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    engine.add(resumed)
    items = []
    while engine.has_work():
        items += [item for _, item in engine.step().items]
    assert [t for i in items for t in i.token_ids] == whole[6:]
    assert [i.output_tokens for i in items if i.token_ids] == list(range(7, 15))  # counted on from the output had
    assert items[-1].finish_reason == "length" and all(i.handovers == 1 and i.prompt_tokens == 20 for i in items)
