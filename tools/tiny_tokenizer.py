"""make_tiny_model.py's tokenizer: a byte-level BPE trained here on tools/data/corpus.txt, and its
tokenizer_config.json with a ChatML chat template (a vision model's writes image parts too)."""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tools import tiny_vision

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt")

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(vocab_size: int, specials: list[str], bos: str | None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(CORPUS, encoding="utf-8") as f:
        lines = f.read().splitlines()
    tok.train_from_iterator(lines, trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_config(arch: dict, max_positions: int, vision: bool = False) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": arch["bos"],
        "eos_token": arch["eos"],
        "pad_token": arch["eos"],
        "unk_token": None,
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
        "chat_template": ("{{ bos_token }}" if arch["bos"] else "") + (tiny_vision.CHAT_TEMPLATE if vision else CHATML),
    }
