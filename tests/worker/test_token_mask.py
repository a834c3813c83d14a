"""The token bitmask's fill cut into chunks across fill threads: the same rows as one matcher
filling each row on its own, whatever the thread count, and chunks that cover every row once."""

from __future__ import annotations

import json
import random
from concurrent.futures import Future

import pytest
import torch
import xgrammar as xgr
from transformers import AutoTokenizer

from services.worker.grammar import GrammarState
from services.worker.token_mask import MIN_CHUNK_ROWS, TokenMasks, _chunks
from tests.structured_cases import REGEXES, SCHEMAS

ROWS = 3 * MIN_CHUNK_ROWS + 17  # four chunks' worth at most, an uneven cut


@pytest.mark.parametrize(("n", "threads"), [(0, 4), (1, 4), (63, 4), (64, 4), (200, 4), (1000, 3), (5000, 8)])
def test_chunks_cover_every_row_once_and_are_never_too_small(n: int, threads: int) -> None:
    chunks = _chunks(n, threads)
    assert [i for lo, hi in chunks for i in range(lo, hi)] == list(range(n))
    assert len(chunks) <= threads
    if len(chunks) > 1:
        assert min(hi - lo for lo, hi in chunks) >= MIN_CHUNK_ROWS
        assert max(hi - lo for lo, hi in chunks) - min(hi - lo for lo, hi in chunks) <= 1


def _states(tiny_llama: str) -> tuple[list[GrammarState], int]:
    """ROWS grammars of varied kinds, each walked a random number of allowed tokens in."""
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    vocab = len(tok)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    grammars = [compiler.compile_json_schema(json.dumps(s)) for s in SCHEMAS[:6]]
    grammars += [compiler.compile_regex(r) for r in REGEXES[:4]]
    rng = random.Random(5)
    mask = xgr.allocate_token_bitmask(1, vocab)
    states = []
    for i in range(ROWS):
        done: Future = Future()
        done.set_result(grammars[i % len(grammars)])
        state = GrammarState(done, prompt_len=0)
        state.start()
        assert state.matcher is not None
        for pos in range(rng.randrange(6)):
            if state.ended:
                break
            state.matcher.fill_next_token_bitmask(mask)
            allowed = [t for t in range(vocab) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
            state.advance(pos, rng.choice(allowed))
        states.append(state)
    return states, vocab


def test_the_chunked_fill_gives_each_row_its_matchers_own_mask(tiny_llama: str) -> None:
    states, vocab = _states(tiny_llama)
    # every other row constrained, so the rows a chunk fills are not contiguous
    rows = [(2 * i, s) for i, s in enumerate(states)]
    expected = torch.full(xgr.get_bitmask_shape(2 * ROWS, vocab), -1, dtype=xgr.bitmask_dtype)
    for i, s in rows:
        if s.needs_mask:
            assert s.matcher is not None
            s.matcher.fill_next_token_bitmask(expected, i)
    for threads in (1, 3, 4):
        masks = TokenMasks(2 * ROWS, vocab, torch.device("cpu"), fill_threads=threads)
        advanced = []
        step = masks.finish(masks.begin(lambda a=advanced: a.append(True), rows))
        assert advanced == [True]  # the advance ran first, in the mask thread
        assert step is not None
        filled = [i for i, s in rows if s.needs_mask]
        assert step.rows == filled
        assert torch.equal(step.bitmask[filled], expected[filled]), threads
