"""include_stop_str_in_output: the stop string that ended a choice is found past the text
sent and added back, whole or streamed; nothing is added when no stop string ended it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from services.tokenizer.openai.stop_strings import StopEcho, stop_string_hit
from shared.messages import FINISH_LENGTH, FINISH_STOP, TextItem

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!"}


def _tok() -> SimpleNamespace:
    def decode(ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(PIECES[i] for i in ids)

    return SimpleNamespace(hf=SimpleNamespace(decode=decode))


def test_the_stop_string_that_ended_the_output_is_found() -> None:
    tok = _tok()
    assert asyncio.run(stop_string_hit(tok, [1, 2, 3, 4], "Hello", ["x", " wo"], True)) == " wo"  # type: ignore[arg-type]
    assert asyncio.run(stop_string_hit(tok, [1, 2], "Hello", [" wo"], True)) == ""  # type: ignore[arg-type]
    assert asyncio.run(stop_string_hit(tok, [1, 2, 3], "Bye", [" wo"], True)) == ""  # type: ignore[arg-type]


def test_a_stream_gets_it_on_the_item_that_ends() -> None:
    echo = StopEcho(_tok(), ["ld"], True, choices=1)  # type: ignore[arg-type]

    async def run() -> list[str]:
        first = await echo.text(0, TextItem(rid="r", text="Hello", token_ids=[1, 2]))
        last = await echo.text(0, TextItem(rid="r", text=" wor", token_ids=[3, 4], finish_reason=FINISH_STOP))
        return [first, last]

    assert asyncio.run(run()) == ["Hello", " world"]
    other = StopEcho(_tok(), ["ld"], True, choices=1)  # type: ignore[arg-type]
    item = TextItem(rid="r", text="Hel", token_ids=[1], finish_reason=FINISH_LENGTH)
    assert asyncio.run(other.text(0, item)) == "Hel"
