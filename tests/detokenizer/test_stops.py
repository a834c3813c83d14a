"""Stop strings: cut exactly, never streamed even in part."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from services.detokenizer.stops import StopMatcher


def _stream(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    sent = ""
    for p in pieces:
        out, hit = m.feed(p)
        sent += out
        if hit:
            return sent, True
    return sent + m.flush(), False


def test_cut_before_the_stop_string() -> None:
    assert _stream(["END"], ["hello E", "N", "D and more"]) == ("hello ", True)
    assert _stream(["\n\n"], ["a\n", "\nb"]) == ("a", True)


def test_partial_match_is_held_then_released() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("go ST") == ("go ", False)
    assert m.feed("ART") == ("START", False)
    assert m.flush() == ""
    m2 = StopMatcher(["STOP"])
    assert m2.feed("ST") == ("", False)
    assert m2.flush() == "ST"


def test_earliest_of_several_stops_wins() -> None:
    assert _stream(["world", "lo w"], ["hello world"]) == ("hel", True)


def test_no_stops_passes_through() -> None:
    assert _stream([], ["a", "b"]) == ("ab", False)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abcXY世😀\n", max_size=40),
    stops=st.lists(st.text(alphabet="abcXY世😀\n", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_streamed_text_equals_cutting_at_the_first_completed_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    """Generation stops as soon as the text so far contains a stop string, and the output is
    that text cut where the earliest stop string in it begins; text arrives in chunks."""
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    expected = (text, False)
    for end in bounds[1:]:
        hits = [i for i in (text[:end].find(s) for s in stops) if i >= 0]
        if hits:
            expected = (text[: min(hits)], True)
            break
    assert _stream(stops, pieces) == expected


def test_the_first_stop_to_complete_ends_the_output() -> None:
    # "X" completes while "YXX" could still be coming: generation has stopped by then
    assert _stream(["X", "YXX"], ["YX", "X"]) == ("Y", True)
    assert _stream(["X", "YXX"], ["YXX"]) == ("", True)
