"""What a stream sends: a chunk for every step with tokens (empty text included), and, for
items that queued up, one per generation (coalescing): in order, text and tokens joined, the
end kept, an error never swallowing the text before it."""

from __future__ import annotations

from services.tokenizer.fanout import _joined
from shared.messages import FINISH_ERROR, TextItem


def _item(text: str, ids: list[int], finish: str = "", error: str = "") -> TextItem:
    return TextItem("r", text, ids, [-0.5] * len(ids), [], finish, error, "", 3, 0)


def test_items_of_one_generation_join_in_order_and_keep_the_end() -> None:
    ready = [(0, _item("a", [1])), (1, _item("x", [7])), (0, _item("", [2])), (0, _item("bc", [3], "length"))]
    out = _joined(ready)
    assert [i for i, _ in out] == [0, 1]
    first = out[0][1]
    assert (first.text, first.token_ids, first.finish_reason) == ("abc", [1, 2, 3], "length")
    assert first.logprobs == [-0.5] * 3
    assert out[1][1].text == "x"


def test_an_error_stays_apart_from_the_text_before_it() -> None:
    out = _joined([(0, _item("a", [1])), (0, _item("", [], FINISH_ERROR, "boom"))])
    assert [(it.text, it.finish_reason) for _, it in out] == [("a", ""), ("", FINISH_ERROR)]


def test_nothing_joins_after_an_end() -> None:
    out = _joined([(0, _item("a", [1], "stop")), (0, _item("b", [2]))])
    assert [it.text for _, it in out] == ["a", "b"]


def test_a_step_whose_token_ends_mid_character_still_gets_its_chunk() -> None:
    from services.tokenizer.openai.completions import has_news

    assert has_news("", _item("", [200]))  # bytes of a character not complete yet
    assert has_news("", _item("", [], "stop"))  # the end, with nothing new
    assert has_news("é", _item("é", [201]))
    assert not has_news("", _item("", []))  # nothing happened: no chunk
