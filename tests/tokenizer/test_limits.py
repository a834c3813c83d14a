"""The bounds all three dialects share, checked on their own."""

from __future__ import annotations

import pytest

from services.tokenizer.limits import MAX_STOPS, check_stops, check_top_k


@pytest.mark.parametrize("top_k", [None, -1, 1, 50])
def test_top_k_is_the_whole_vocabulary_or_positive(top_k: int | None) -> None:
    assert check_top_k(top_k) == top_k


@pytest.mark.parametrize("top_k", [0, -2])
def test_other_top_k_is_refused(top_k: int) -> None:
    with pytest.raises(ValueError, match="whole vocabulary"):
        check_top_k(top_k)


def test_stops_pass_through_unchanged() -> None:
    assert check_stops(None) is None
    assert check_stops("x") == "x"
    assert check_stops(["a"] * MAX_STOPS) == ["a"] * MAX_STOPS


def test_empty_and_too_many_stops_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        check_stops("")
    with pytest.raises(ValueError, match=f"at most {MAX_STOPS}"):
        check_stops(["a"] * (MAX_STOPS + 1))
