"""blas_choice.refine_in_step: the whole step has the last word on each projection's choice
(a pure function of the step timings it is given; runs on the CPU)."""

from __future__ import annotations

from services.worker.runtime.blas_choice import DEFAULT, refine_in_step


def test_refine_in_step_keeps_a_choice_only_where_the_step_is_faster_with_it() -> None:
    """Each non-default choice is tried back on cuBLAS in the whole step; ties go to cuBLAS."""
    algo_a, algo_b = "cublaslt", object()  # stand-ins: anything but the default
    costs = {"qkv": (0.2, 0.0), "o": (-0.1, 0.0), "down": (0.0, 0.0)}  # (chosen's cost, default's) in ms

    def step_ms(choice: dict) -> float:
        return 4.5 + sum(c if choice.get(name, DEFAULT) != DEFAULT else d for name, (c, d) in costs.items())

    chosen = {"qkv": algo_a, "o": algo_b, "down": algo_a, "lm_head": DEFAULT}
    kept = refine_in_step(chosen, step_ms)
    assert kept == {"qkv": DEFAULT, "o": algo_b, "down": DEFAULT, "lm_head": DEFAULT}
    assert refine_in_step({"qkv": DEFAULT}, step_ms) == {"qkv": DEFAULT}
