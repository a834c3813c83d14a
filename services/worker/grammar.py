"""Structured output in the worker: each request's grammar, compiled off the step loop.

A request's Constraint (shared/messages.py: a JSON schema, any JSON object, a regex, a choice
list or an EBNF grammar) is compiled by xgrammar once per distinct
constraint (kind and text): the compiled grammars are kept in a cache keyed by it, and a
compile runs in a thread of its own, so the step loop never waits on one. Until its grammar
is compiled a request waits in the scheduler (Scheduler.compiling); a constraint that does
not compile fails its request with a 400 (ERR_INVALID) that says why.

Each request then holds a GrammarState: xgrammar's matcher, advanced by every token the
request produces (the engine feeds them as they come back from the device), which says
which tokens may come next (token_mask.py turns that into a bitmask for the sampler) and
when the grammar has ended the output. The grammar's end is an end token it accepts: the
tokenizer's and the model's end-of-sequence tokens are the grammar's stop tokens.

JSON is generated compact (", " and ": " between items, no other whitespace): a grammar
that allows any whitespace lets a model fill its output with it. A schema with a keyword
xgrammar would ignore is refused (schema_support.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import xgrammar as xgr
from transformers import AutoTokenizer

from services.worker.schema_support import unsupported
from shared.messages import (
    CONSTRAINT_CHOICE,
    CONSTRAINT_GRAMMAR,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_REGEX,
    Constraint,
)

log = logging.getLogger(__name__)

CACHE_SIZE = 128  # compiled grammars kept (a 128k vocabulary's grammar holds masks of it: up to MBs)
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")  # "[13:50:14] file.cc:94: "


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message says why."""


class Grammars:
    """The compiler (the tokenizer's vocabulary as xgrammar sees it), its thread, and the
    compiled grammars by constraint."""

    def __init__(self, tokenizer_dir: str, vocab_size: int, stop_ids: frozenset[int]) -> None:
        """vocab_size: the model's (its logits' width, past the tokenizer's own when padded);
        stop_ids: the tokens that end a generation, so the grammar's end."""
        self.tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        # one thread: compiles run one after another, each with xgrammar's own threads
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._compiler: Future[xgr.GrammarCompiler] | None = None
        self._cache: OrderedDict[tuple[str, str], Future[xgr.CompiledGrammar]] = OrderedDict()  # (kind, text)

    def start(self) -> None:
        """Read the tokenizer's vocabulary in the background now, not at the first constraint."""
        if self._compiler is None:
            self._compiler = self._pool.submit(self._make_compiler)

    def state(self, constraint: Constraint, prompt_len: int) -> GrammarState:
        """A new request's grammar: compiled already, or on its way."""
        key = (constraint.kind, constraint.text)
        future = self._cache.get(key)
        if future is None:
            self.start()
            future = self._pool.submit(self._compile, constraint)
            self._cache[key] = future
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return GrammarState(future, prompt_len, constraint.after_token)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- in the compile thread

    def _make_compiler(self) -> xgr.GrammarCompiler:
        tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids)
        threads = grammar_threads()
        log.info("grammars: vocabulary of %d tokens read, %s", self.vocab_size, info.vocab_type.name)
        return xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)  # the cache is ours

    def _compile(self, c: Constraint) -> xgr.CompiledGrammar:
        assert self._compiler is not None
        compiler = self._compiler.result()
        started = time.perf_counter()
        try:
            compiled = _build(compiler, c)
        except RuntimeError as e:  # xgrammar reports a bad schema or regex as a RuntimeError
            raise GrammarError(f"{c.kind}: {xgrammar_message(e)}") from None
        ms = 1000 * (time.perf_counter() - started)
        log.info("grammar compiled: %s of %d characters in %.1f ms", c.kind, len(c.text), ms)
        return compiled


def _build(compiler: xgr.GrammarCompiler, c: Constraint) -> xgr.CompiledGrammar:
    if c.kind == CONSTRAINT_JSON_SCHEMA:
        return compiler.compile_grammar(json_grammar(c.text))
    if c.kind == CONSTRAINT_JSON_OBJECT:
        return compiler.compile_grammar(json_grammar('{"type": "object"}'))
    if c.kind == CONSTRAINT_REGEX:
        return compiler.compile_regex(c.text)
    if c.kind == CONSTRAINT_CHOICE:
        return compiler.compile_grammar(choice_grammar(c.text))
    if c.kind == CONSTRAINT_GRAMMAR:
        return compiler.compile_grammar(c.text)
    raise GrammarError(f"unknown constraint kind {c.kind!r}")


# xgrammar 0.2.9 writes the characters of a string with minLength or maxLength as this class,
# which lets raw control characters (a tab, say) into the string: invalid JSON. Its other
# strings exclude them, as this does; a version that fixes it no longer writes the class.
_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"


def json_grammar(schema: str) -> str:
    """A JSON schema -> the EBNF grammar of the compact JSON it allows (no whitespace but one
    space after each ":" and ",", strict: no properties the schema does not name)."""
    try:
        parsed = json.loads(schema)
    except ValueError:
        parsed = None  # xgrammar says what is wrong with it
    if why := unsupported(parsed):
        raise RuntimeError(why)  # as xgrammar reports a schema it refuses
    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
    return ebnf.replace(_STRING_CHAR, _JSON_STRING_CHAR)


def choice_grammar(text: str) -> str:
    """A JSON array of strings -> the EBNF grammar of exactly one of them."""
    try:
        choices = json.loads(text)
    except ValueError as e:
        raise GrammarError(f"choice: not a JSON array of strings: {e}") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choice: must be a non-empty array of non-empty strings")
    # a JSON string literal is an EBNF string literal: the same escapes
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def xgrammar_message(e: Exception) -> str:
    """xgrammar's error without its time and source location."""
    return _XGR_PREFIX.sub("", str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def grammar_threads() -> int:
    """Threads the grammar work takes, the compiler's and the token mask's fill: half the
    machine's cores, at most 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class GrammarState:
    """One request's grammar: compiled (or on its way), and its matcher once it starts. With
    an after_token (a reasoning model's end of thinking), the output is free up to and
    including that token, and held to the grammar from the next."""

    __slots__ = ("after", "future", "matcher", "next_pos", "rejected", "terminated")

    def __init__(self, future: Future[xgr.CompiledGrammar], prompt_len: int, after_token: int = -1) -> None:
        self.future = future
        self.matcher: xgr.GrammarMatcher | None = None
        self.next_pos = prompt_len  # the position in the request's tokens of the next token to accept
        self.rejected = -1  # a token the grammar did not allow (it never should: the mask bans it)
        # the matcher accepted an end token; kept here since only an accept changes it, and asking
        # xgrammar costs about a microsecond a request a step, twice, at a batch of thousands
        self.terminated = False
        self.after = after_token  # -1 once the grammar applies

    @property
    def ready(self) -> bool:
        return self.future.done()

    def error(self) -> str:
        """Why the grammar cannot be used ("" when it can); call once ready."""
        e = self.future.exception()
        if e is None:
            return ""
        return str(e) if isinstance(e, GrammarError) else f"the grammar could not be compiled: {e}"

    def start(self, output: Sequence[int] = ()) -> None:
        """The request leaves the scheduler's compiling queue: its matcher from the compiled grammar,
        which takes in the output the request already has (one handed over from a dead group
        arrives with it among its input ids, GenerateReq.resumed), so the next mask follows it."""
        self.matcher = xgr.GrammarMatcher(self.future.result())
        for token in output:
            self.advance(self.next_pos, token)

    def advance(self, pos: int, token: int) -> None:
        """The request's token at pos came back from the device. Tokens come in order; one
        already accepted (the engine may feed a step's tokens early) is skipped."""
        if pos < self.next_pos or self.matcher is None or self.ended:
            return
        self.next_pos = pos + 1
        if self.after >= 0:  # free text until the token that opens the grammar
            self.after = -1 if token == self.after else self.after
            return
        if not self.matcher.accept_token(token):
            self.rejected = token
        self.terminated = self.matcher.is_terminated()

    @property
    def ended(self) -> bool:
        """The output is complete (the grammar accepted an end token), or cannot go on."""
        return self.rejected >= 0 or self.terminated

    @property
    def needs_mask(self) -> bool:
        """Whether the next token is constrained (not before the grammar applies, nor once it ended)."""
        return self.matcher is not None and self.after < 0 and not self.ended
