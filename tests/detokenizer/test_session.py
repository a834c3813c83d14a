"""A request's detokenization session: text, stop strings and finish reasons."""

from __future__ import annotations

from services.detokenizer.session import DetokSession
from shared.messages import DetokRegister, TokenItem


class _Bytes:
    """A toy decoder: token id = one character (ids < 256) -> easy to reason about."""

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


def _session(stop: list[str]) -> DetokSession:
    return DetokSession(DetokRegister("r", "front", 5, stop, True, 0.0), _Bytes())


def _item(text: str, n_before: int, finish: str = "", cached: int = 0) -> TokenItem:
    ids = [ord(c) for c in text]
    return TokenItem(
        "r", ids, prompt_tokens=5, output_tokens=n_before + len(ids), finish_reason=finish, cached_tokens=cached
    )


def test_text_flows_and_the_worker_finish_is_passed_on() -> None:
    s = _session([])
    out, ended = s.apply(_item("ab", 0))
    assert (out.text, ended, out.finish_reason) == ("ab", False, "")
    out, ended = s.apply(_item("c", 2, "length"))
    assert (out.text, ended, out.finish_reason, out.output_tokens, out.prompt_tokens) == ("c", True, "length", 3, 5)


def test_stop_string_ends_the_request_and_cuts_the_text() -> None:
    s = _session(["xy"])
    assert s.apply(_item("abx", 0))[0].text == "ab"
    out, ended = s.apply(_item("yz", 3))
    assert (out.text, ended, out.finish_reason) == ("", True, "stop")


def test_held_text_is_released_when_the_worker_ends_the_request() -> None:
    s = _session(["xy"])
    assert s.apply(_item("abx", 0))[0].text == "ab"
    out, ended = s.apply(_item("", 3, "length"))
    assert (out.text, ended, out.finish_reason) == ("x", True, "length")


def test_a_restarted_request_is_failed_not_repeated() -> None:
    s = _session([])
    s.apply(_item("ab", 0))
    out, ended = s.apply(_item("a", 0))  # output count went back to 1: a worker started it again
    assert ended and out.finish_reason == "error" and "restarted" in out.error


def test_the_prompt_tokens_served_from_the_cache_reach_every_text_item() -> None:
    s = _session(["xy"])
    out, _ = s.apply(_item("ab", 0, cached=4))
    assert (out.prompt_tokens, out.cached_tokens) == (5, 4)
    out, _ = s.apply(_item("x", 2))  # an item without the count keeps the one reported
    assert (out.text, out.cached_tokens) == ("", 4)
    out, ended = s.apply(_item("y", 3, cached=4))  # the end the stop string makes
    assert (ended, out.finish_reason, out.cached_tokens) == (True, "stop", 4)


def test_the_end_of_a_restarted_request_keeps_its_cached_count() -> None:
    s = _session([])
    s.apply(_item("ab", 0, cached=3))
    out, ended = s.apply(_item("a", 0, cached=1))  # another worker started it again
    assert ended and out.finish_reason == "error" and out.cached_tokens == 3


def test_a_hand_over_continues_from_the_tokens_sent_and_drops_the_dead_copys_items() -> None:
    from shared.messages import GenerateReq, SamplingParams

    s = _session([])
    s.apply(_item("ab", 0))
    s.apply(_item("c", 2))
    original = GenerateReq("r", "front", "detok", [1, 2, 3, 4, 5], SamplingParams(max_new_tokens=9), 1.0, 2.0)
    go_on = s.hand_over(original)
    assert (go_on.input_ids, go_on.resumed, go_on.handovers) == ([1, 2, 3, 4, 5, 97, 98, 99], 3, 1)
    assert go_on.prompt_len == 5 and go_on.params == original.params and go_on.deadline == 2.0
    assert s.stale(_item("d", 3))  # the dead group was only silent: its next token is not the client's
    fresh = TokenItem("r", [ord("d")], prompt_tokens=5, output_tokens=4, handovers=1)
    assert not s.stale(fresh) and s.apply(fresh)[0].text == "d"
    again = s.hand_over(go_on)  # its second group died too: the prompt is still the first five
    assert (again.input_ids, again.resumed, again.handovers) == ([1, 2, 3, 4, 5, 97, 98, 99, 100], 4, 2)


def test_a_batch_sent_twice_is_known_and_a_different_one_is_not() -> None:
    """A worker's batch sent again (a retried send, a failover's set-back group) holds the tokens
    the session has where its count puts them: repeated, to be dropped. Other tokens there are a
    restart (test_a_restarted_request_is_failed_not_repeated)."""
    s = _session([])
    s.apply(_item("ab", 0))
    assert s.repeated(_item("ab", 0))
    s.apply(_item("cd", 2))
    assert s.repeated(_item("ab", 0)) and s.repeated(_item("cd", 2))
    assert not s.repeated(_item("ax", 0))  # other tokens at that place
    assert not s.repeated(_item("e", 4))  # the next batch
    assert not s.repeated(_item("", 4, "length"))  # an end without tokens
