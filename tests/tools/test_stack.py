"""tools/stack.py's command lines and environments, without starting anything."""

from __future__ import annotations

from tools.stack import Stack, StackOptions


def test_each_worker_group_can_have_gpus_of_its_own() -> None:
    def gpus(**kw) -> list[str | None]:
        stack = Stack(StackOptions(model_dir="m", redis_url="redis://x", port=1, workers=2, **kw))
        return [stack.services[f"worker-{g}"].env.get("CUDA_VISIBLE_DEVICES") for g in range(2)]

    assert gpus() == [None, None]  # every group sees every GPU
    assert gpus(gpus_per_worker=1) == ["0", "1"]
    assert gpus(gpus_per_worker=2) == ["0,1", "2,3"]
