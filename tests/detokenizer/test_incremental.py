"""Incremental detokenization equals a full decode, whatever the token sequence."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.detokenizer.incremental import IncrementalDecoder
from tests import hf_reference


class _HF:
    def __init__(self, tok) -> None:
        self.tok = tok

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tok.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@functools.cache
def _text_pool(model_dir: str) -> list[list[int]]:
    tok = hf_reference.tokenizer(model_dir)
    texts = ["naïve café 😀🚀 世界 こんにちは", " leading spaces  and\ttabs\n", "Ünïcode ∑∫√ ∞ ≈ ≠", "plain words here"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _check(model_dir: str, ids: list[int], chunks: list[int], skip: bool) -> None:
    tok = hf_reference.tokenizer(model_dir)
    dec = IncrementalDecoder(_HF(tok), skip)
    deltas, i, k = [], 0, 0
    while i < len(ids):
        n = chunks[k % len(chunks)]
        k += 1
        deltas.append(dec.push(ids[i : i + n]))
        i += n
    deltas.append(dec.flush())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    for d in deltas[:-1]:  # no half character is ever streamed before the end
        assert not d.endswith("\ufffd") or "\ufffd" in tok.decode(ids, skip_special_tokens=skip)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data=st.data())
def test_random_token_sequences(tiny_models: dict[str, str], data: st.DataObject) -> None:
    model_dir = tiny_models[data.draw(st.sampled_from(sorted(tiny_models)))]
    vocab = hf_reference.tokenizer(model_dir).vocab_size
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40))
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    _check(model_dir, ids, chunks, data.draw(st.booleans()))


@SETTINGS
@given(data=st.data())
def test_real_text_split_anywhere(tiny_models: dict[str, str], data: st.DataObject) -> None:
    """Non-ASCII text whose characters span several byte-level tokens, with special tokens mixed in."""
    model_dir = tiny_models[data.draw(st.sampled_from(sorted(tiny_models)))]
    pool = _text_pool(model_dir)
    ids: list[int] = []
    for _ in range(data.draw(st.integers(1, 4))):
        ids += data.draw(st.sampled_from(pool))
        if data.draw(st.booleans()):
            ids.append(data.draw(st.sampled_from([0, 1, 2])))  # special tokens sit at the start of the vocab
    chunks = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    _check(model_dir, ids, chunks, data.draw(st.booleans()))


def test_multibyte_character_is_held_until_complete(tiny_llama: str) -> None:
    tok = hf_reference.tokenizer(tiny_llama)
    ids = tok("😀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # the emoji's four bytes are several tokens in the tiny vocabulary
    dec = IncrementalDecoder(_HF(tok))
    assert [dec.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.push(ids[-1:]) == "😀"
