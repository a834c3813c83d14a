"""The multi-turn workload over HTTP, closed loop: each conversation sends its next turn when
the turn before it has finished, the history holding the server's own output token ids.

The front end takes token-id prompts on /v1/completions but answers text. The output ids come
back through the completion's logprobs (logprobs: 0, the chosen token only): each token is
named by its label there, its text, or "bytes:\\xe4\\xbd" for part of a character
(services/tokenizer/tokenization.py). LabelIndex turns labels back into ids with the served
model's tokenizer; in a byte-level BPE vocabulary (Llama 3's, the benchmark model's) every
label names one id. A label several ids share is counted in the results (ambiguous_tokens):
the history then holds the first such id and the cache misses from there.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from tools.bench_workloads import Conversation, conversations


class LabelIndex:
    def __init__(self, model_dir: str) -> None:
        from services.tokenizer.tokenization import Tokenization  # transformers: only for this workload

        tok = Tokenization(model_dir, threads=1)
        self.ids: dict[str, int] = {}
        self.shared: set[str] = set()  # labels of more than one id
        for i in range(len(tok.hf)):
            label = tok.token_label(i)
            if label in self.ids:
                self.shared.add(label)
            else:
                self.ids[label] = i
        tok.shutdown()
        self.ambiguous = 0  # tokens read back whose label more than one id has
        self.unknown = 0  # labels of no id (the reply is then cut there)

    def token_ids(self, labels: list[str]) -> list[int]:
        out = []
        for label in labels:
            i = self.ids.get(label)
            if i is None:
                self.unknown += 1
                break
            self.ambiguous += label in self.shared
            out.append(i)
        return out


Send = Callable[[list[int], int], Awaitable]  # (prompt ids, output length) -> a finished Outcome


async def run_conversations(args: argparse.Namespace, send: Send, index: LabelIndex, done: Callable[[], None]) -> dict:
    """Every conversation at once, each a task sending its turns in order; -> the outcomes of
    every turn sent, the seconds from the first to the last, and the conversations' count."""
    convs = [Conversation(turns) for turns in conversations(args, args.vocab)]
    outcomes: list = []

    async def talk(c: Conversation) -> None:
        while True:
            out = await send(c.prompt, c.output_len)
            outcomes.append(out)
            done()
            if not out.ok:
                return
            reply = index.token_ids(out.labels)
            if len(reply) != out.output_tokens:
                out.error = f"{len(out.labels)} labels, {len(reply)} ids read, {out.output_tokens} tokens"
                out.ok = False
                return
            if not c.advance(reply):
                return

    begin = time.perf_counter()
    await asyncio.gather(*(talk(c) for c in convs))
    return {
        "outcomes": outcomes,
        "duration": time.perf_counter() - begin,
        "conversations": len(convs),
        "turns": sum(len(c.turns) for c in convs),
    }
