"""What the router knows of one worker group: its last status, what it admitted there, and an
index of the prompts it placed there (what the group's prompt cache probably holds).

With the prompt cache on, a group's pool holds three kinds of tokens:
- each request's own: its output, and prompt tokens not in the cache's tree;
- the tree's tokens requests hold (cache_locked_tokens), each once however many share it;
- the tree's tokens no request holds (evictable_tokens): freed on demand, as good as free.
The admission estimate is LightLLM's peak over the requests' own tokens, plus the second
kind once; the third is room. The tokens requests hold in the tree are the larger of the
worker's count and the index's (the prompts placed here, each token once, counting those of
requests not started yet, which the worker does not), so a request this router placed owns
only its output. A prefix that only evictable tokens hold is not paid for twice: it is room
now, and held again by the request placed on it. With the cache off every cache figure is 0
and this is LightLLM's rule."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.router.admission import Load, estimated_remaining, peak_tokens
from services.router.metrics import GroupFigures
from services.router.prefix_index import PrefixIndex
from shared.config import RouterConfig
from shared.messages import GenerateReq, WorkerStatus
from shared.prefix_tree import Node

# A router that first hears of a group numbers its AdmitReqs from the group's reported
# admit_seq plus this gap: a predecessor router (or this one before a restart) may have
# sent admissions the group has not taken in yet, and their seqs must stay below ours,
# or the group's admit_seq would seem to acknowledge admissions it never saw.
SEQ_GAP = 1 << 20


@dataclass
class Placed:
    req: GenerateReq | None  # None when learnt from a status only (the router restarted)
    seq: int  # the AdmitReqs that carried it; 0 when learnt from a status
    detok: str
    prompt_tokens: int
    max_new_tokens: int
    ignore_eos: bool
    held: int = 0
    # of held, the tokens in the group's cache tree; for a request not started yet, the prefix the
    # router's index matched: they need no prefill
    cached: int = 0
    remaining: int = 0
    output_tokens: int = 0
    paused: bool = False  # preempted by the worker: holds no KV now, resumes by recomputation
    reported: bool = False  # the group's status has listed it
    aborted: bool = False  # its abort is on the way to the group
    node: Node | None = None  # its prompt's path in the group's index, held while it is placed here


@dataclass(frozen=True)
class PrefixLookup:
    """What a group's index says of a request's prompt."""

    matched: int  # prompt tokens the group's cache probably holds: they need no prefill (0: cache not seen)
    adds: int  # tokens placing it adds to the group's count: its prompt less what placed requests hold


@dataclass
class GroupState:
    name: str
    instance: str
    capacity: int
    max_running: int
    free_tokens: int
    last_seen: float
    next_seq: int  # AdmitReqs.seq for the next admission to this instance
    acked_seq: int = 0  # the last seq this instance reported taking in
    placed: dict[str, Placed] = field(default_factory=dict)
    paused: int = 0  # requests the last status reported paused
    admitted: int = 0  # requests this router placed here, for the figures
    evictable_tokens: int = 0  # the cache's tokens no request holds, by the last status
    cache_locked_tokens: int = 0  # the cache's tokens running requests hold, by the last status
    # this instance keeps a prompt cache, by its statuses: the index means something
    cache_seen: bool = False
    draining: bool = False  # shutting down, by its statuses: nothing more is placed here
    index: PrefixIndex = field(default_factory=lambda: PrefixIndex(0))
    # cache_aware: the request this group's lane waits for, and how many requests started ahead of it
    lane_head: str = ""
    overtaken: int = 0

    @classmethod
    def from_status(cls, st: WorkerStatus, now: float) -> GroupState:
        g = cls(st.group, st.instance, st.capacity_tokens, st.max_running, st.free_tokens, now, st.admit_seq + SEQ_GAP)
        g.apply(st, now)
        return g

    def apply(self, st: WorkerStatus, now: float) -> tuple[list[str], list[str]]:
        """Take a status in; -> (rids the group no longer holds: they ended,
        rids it holds that this router did not place there)."""
        self.last_seen = now
        self.capacity = st.capacity_tokens
        self.max_running = st.max_running
        self.free_tokens = st.free_tokens
        self.evictable_tokens = st.evictable_tokens
        self.cache_locked_tokens = st.cache_locked_tokens
        self.cache_seen = st.prompt_cache
        self.draining = st.draining
        self.acked_seq = max(self.acked_seq, st.admit_seq)
        self.index.resize(st.capacity_tokens)
        t = st.running
        listed = set(t.rids)
        # a request placed by an AdmitReqs the group has not taken in yet is simply not listed yet
        gone = [rid for rid, p in self.placed.items() if rid not in listed and p.seq <= self.acked_seq]
        for rid in gone:
            self.unplace(rid)
        learnt = []
        placed = self.placed
        for rid, detok, prompt, held, remaining, paused, cached in zip(*t.columns(), strict=True):
            p = placed.get(rid)
            if p is None:  # admitted by a predecessor router, or before the group was declared dead
                p = Placed(None, 0, detok, prompt, remaining + held - prompt, False)
                placed[rid] = p
                learnt.append(rid)
            p.held = held
            p.output_tokens = held - prompt
            # a request waiting to start has no cache match yet by the worker's count: keep the index's
            p.cached = cached if p.output_tokens else max(cached, p.cached)
            p.remaining = remaining
            p.paused = paused
            p.reported = True
        self.paused = sum(t.paused)
        self._watch_cache()
        return gone, learnt

    def _watch_cache(self) -> None:
        """A worker whose cache reports no tokens while it holds no request has an empty cache
        (emptied, or never filled): what the index says it holds, it no longer does."""
        cache = self.evictable_tokens + self.cache_locked_tokens
        if not cache and not self.placed and self.index.size:
            self.index.reset()

    def place(self, req: GenerateReq, matched: int) -> None:
        """req goes here; ``matched``: its prompt's prefix this group's cache is taken to hold."""
        p = req.params
        self.placed[req.rid] = Placed(
            req,
            self.next_seq,
            req.detok,
            req.prompt_len,
            p.max_new_tokens,
            p.ignore_eos,
            held=len(req.input_ids),
            cached=matched,
            remaining=p.max_new_tokens - req.resumed,
            output_tokens=req.resumed,
            paused=req.resumed > 0,  # handed over with output: it starts as a paused request resumes
            node=self.index.hold(req.input_ids),
        )
        self.admitted += 1

    def figures(self) -> GroupFigures:
        cached = self.evictable_tokens + self.cache_locked_tokens
        return GroupFigures(
            self.name, self.capacity, self.used_tokens, len(self.placed), self.paused, cached, self.index.size
        )

    def unplace(self, rid: str) -> None:
        p = self.placed.pop(rid)
        if p.node is not None:
            self.index.release(p.node)

    def lookup(self, req: GenerateReq) -> PrefixLookup:
        """The worker computes at least the prompt's last token (the first output's logits), so at
        most all but that one is matched. A group without a prompt cache matches nothing."""
        n = len(req.input_ids)
        if not self.cache_seen:
            return PrefixLookup(0, n)
        m = self.index.match(req.input_ids)
        return PrefixLookup(max(min(m.length, n - 1), 0), n - m.locked)

    @property
    def room(self) -> int:
        """KV tokens free now by the last status: the cache's evictable tokens are as good as free."""
        return self.free_tokens + self.evictable_tokens

    @property
    def used_tokens(self) -> int:
        return self.capacity - self.room

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.room / self.capacity if self.capacity else 1.0

    def shared_tokens(self, adds: int = 0) -> int:
        """Cache tokens its requests hold, each once: the worker's count, or the index's of the
        prompts placed here (with ``adds`` more), whichever is larger."""
        if not self.cache_seen:
            return self.cache_locked_tokens  # 0: the cache is off, or nothing has reached it yet
        return max(self.cache_locked_tokens, self.index.locked_size + adds)

    def own_tokens(self, p: Placed) -> int:
        """What a request holds beyond the shared tokens: with the cache on, its prompt is among
        them when this router placed it (a request learnt from a status counts whole)."""
        return max(p.held - p.prompt_tokens, 0) if self.cache_seen and p.node is not None else p.held

    def loads(self, busy: bool, guess_len: int) -> list[Load]:
        return [
            Load(
                self.own_tokens(p),
                estimated_remaining(p.max_new_tokens, p.output_tokens, busy or p.ignore_eos, guess_len),
            )
            for p in self.placed.values()
        ]

    def peak_with(self, req: GenerateReq | None, adds: int, busy: bool, guess_len: int) -> int:
        """The most KV tokens its requests (and req, which adds ``adds``) can hold at once."""
        loads = self.loads(busy, guess_len)
        shared = 0  # of adds, what goes to the shared tokens (its prompt) rather than to req's own
        if req is not None:
            p = req.params
            remaining = estimated_remaining(p.max_new_tokens, req.resumed, busy or p.ignore_eos, guess_len)
            shared = adds if self.cache_seen else 0
            loads.append(Load(adds - shared, remaining))
        return self.shared_tokens(shared) + peak_tokens(loads)

    def can_take(self, req: GenerateReq, look: PrefixLookup, cfg: RouterConfig) -> bool:
        """Under its request limit and prefill budget, and with a pool that holds req to the end
        by LightLLM's peak estimate. A draining group takes nothing."""
        if self.draining:
            return False
        # requests beyond what the group runs at once would only wait there, where no other group can take them
        if len(self.placed) >= min(cfg.running_max_req_size, self.max_running):
            return False
        backlog = self.backlog_tokens()
        if cfg.batch_max_tokens and backlog and backlog + len(req.input_ids) - look.matched > cfg.batch_max_tokens:
            return False
        busy = self.used_fraction >= cfg.router_token_ratio
        return self.peak_with(req, look.adds, busy, cfg.router_max_new_token_len) <= self.capacity

    def headroom(self) -> int:
        """KV tokens free by the router's count: the pool less what its requests hold, or will hold
        once started or resumed."""
        return self.capacity - self.shared_tokens() - sum(self.own_tokens(p) for p in self.placed.values())

    def backlog_tokens(self) -> int:
        """Tokens placed here that wait for a prefill, as far as we know: the prompts (beyond the
        cache's) of requests with no output yet, and everything a paused request holds (it
        resumes by recomputation)."""
        return sum(p.held - p.cached for p in self.placed.values() if p.output_tokens == 0 or p.paused)
