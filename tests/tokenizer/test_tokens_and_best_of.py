"""Token bytes and labels for logprobs, and best_of's choice."""

from __future__ import annotations

from services.tokenizer.collected import Collected, best
from services.tokenizer.tokenization import Tokenization


def test_token_bytes_make_up_the_text_even_mid_character(tiny_models: dict[str, str]) -> None:
    for model_dir in tiny_models.values():
        tok = Tokenization(model_dir, threads=1)
        try:
            text = "naïve café 😀 世界 plain"
            ids = tok.hf(text, add_special_tokens=False)["input_ids"]
            assert b"".join(tok.token_bytes(t) for t in ids) == text.encode()
            partial = [t for t in ids if "\ufffd" in tok.token_text(t)]
            assert partial, "no token is part of a character: the case goes untested"
            for t in partial:
                assert tok.token_label(t) == "bytes:" + "".join(f"\\x{b:02x}" for b in tok.token_bytes(t))
            whole = [t for t in ids if "\ufffd" not in tok.token_text(t)]
            assert all(tok.token_label(t) == tok.token_text(t) for t in whole)
        finally:
            tok.shutdown()


def test_best_of_keeps_the_highest_cumulative_logprob_best_first() -> None:
    outs = [Collected(text=str(i), logprobs=lps) for i, lps in enumerate([[-1.0, -1.0], [-0.5], [-3.0], [-0.5]])]
    assert [c.text for c in best(outs, 2)] == ["1", "3"]  # a tie keeps the order generated
    assert [c.text for c in best(outs, 4)] == ["0", "1", "2", "3"]
