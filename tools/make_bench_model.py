"""Write a benchmark model directory: a real model's config.json and a synthetic tokenizer of
its full vocabulary, no weights (the worker draws them with --random-weights).

    python tools/make_bench_model.py --out DIR [--shape llama3-8b]

No tokenizer can be downloaded here, and a tokenizer trained on local text has nowhere near
128k tokens; the benchmark's prompts are random token ids anyway. This one is a byte-level
BPE whose merges are generated from a seed: every id from 0 to vocab - 1 decodes to text
(the 256 byte tokens, generated merges, then Llama 3's special tokens), so the detokenizer
does real work on every generated token.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from services.worker.models.bench_shapes import SHAPES

NUM_SPECIAL = 256  # Llama 3 keeps its last 256 ids for special tokens


def byte_chars() -> list[str]:
    """The byte-level alphabet by byte value: printable Latin-1 bytes stand for themselves, the
    others (controls, space, ...) for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def synthetic_tokenizer(
    vocab_size: int, seed: int = 0, num_special: int = NUM_SPECIAL, named: dict[int, str] | None = None
) -> Tokenizer:
    """Tokens that are mostly whole UTF-8 text, as a real vocabulary's are: the 256 bytes, the
    two-byte characters of Latin, Greek and Cyrillic, then merges of printable pieces. (Random
    merges of any bytes made 96% of the tokens partial UTF-8, which no real vocabulary has and
    which makes a grammar engine check nearly every token at every step.) The last num_special
    ids are special tokens: <|begin_of_text|>, <|end_of_text|>, then reserved ones, but where
    named gives an id its own (a vision model's image token at the id its config.json names)."""
    rng = random.Random(seed)
    enc = byte_chars()
    assert sorted(enc) == sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(enc)}
    tokens = list(enc)
    merges = []

    def add(a: str, b: str) -> None:
        vocab[a + b] = len(tokens)
        tokens.append(a + b)
        merges.append((a, b))

    def part(pool: list[str]) -> str:  # favour short parts, so tokens stay a few bytes long
        return pool[min(int(rng.expovariate(1 / 2000)), len(pool) - 1)]

    ascii_pieces = [enc[b] for b in range(32, 127)]  # space and printable ASCII, then their merges
    wide = []  # non-ASCII characters, then their merges: one token in twenty
    for cp in range(0xC0, 0x500):
        lead, cont = chr(cp).encode()
        add(enc[lead], enc[cont])
        wide.append(enc[lead] + enc[cont])
    target = vocab_size - num_special
    while len(tokens) < target:
        pool = wide if rng.random() < 0.05 else ascii_pieces
        a, b = part(pool), part(pool)
        if a + b in vocab or len(a + b) > 16:
            continue
        add(a, b)
        pool.append(a + b)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(num_special - 2)
    ]
    for token_id, name in (named or {}).items():
        if not target + 2 <= token_id < vocab_size:
            raise ValueError(
                f"special token {name} at {token_id}: outside the special ids {target + 2}..{vocab_size - 1}"
            )
        specials[token_id - target] = name
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", target)]
    )
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    args = ap.parse_args(argv)
    cfg = dict(SHAPES[args.shape])
    os.makedirs(args.out, exist_ok=True)
    tok = synthetic_tokenizer(cfg["vocab_size"])
    assert tok.get_vocab_size() == cfg["vocab_size"], tok.get_vocab_size()
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    cfg.update(bos_token_id=bos, eos_token_id=eos)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    files = {
        "config.json": cfg,
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end_of_text|>",
            "model_max_length": cfg["max_position_embeddings"],
            "clean_up_tokenization_spaces": False,
        },
    }
    for name, content in files.items():
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(content, f, indent=2)
    print(args.out)


if __name__ == "__main__":
    main()
