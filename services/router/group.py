"""What the router knows of one worker group: its last status and what it admitted there."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.router.admission import Load, estimated_remaining, peak_tokens
from shared.messages import GenerateReq, WorkerStatus

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
    remaining: int = 0
    output_tokens: int = 0
    paused: bool = False  # preempted by the worker: holds no KV now, resumes by recomputation
    reported: bool = False  # the group's status has listed it
    aborted: bool = False  # its abort is on the way to the group


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
        self.acked_seq = max(self.acked_seq, st.admit_seq)
        t = st.running
        listed = set(t.rids)
        # a request placed by an AdmitReqs the group has not taken in yet is simply not listed yet
        gone = [rid for rid, p in self.placed.items() if rid not in listed and p.seq <= self.acked_seq]
        for rid in gone:
            del self.placed[rid]
        learnt = []
        placed = self.placed
        for rid, detok, prompt, held, remaining, paused, _cached in zip(*t.columns(), strict=True):
            p = placed.get(rid)
            if p is None:  # admitted by a predecessor router, or before the group was declared dead
                p = Placed(None, 0, detok, prompt, remaining + held - prompt, False)
                placed[rid] = p
                learnt.append(rid)
            p.held = held
            p.output_tokens = held - prompt
            p.remaining = remaining
            p.paused = paused
            p.reported = True
        self.paused = sum(t.paused)
        return gone, learnt

    def place(self, req: GenerateReq) -> None:
        p = req.params
        self.placed[req.rid] = Placed(
            req,
            self.next_seq,
            req.detok,
            len(req.input_ids),
            p.max_new_tokens,
            p.ignore_eos,
            held=len(req.input_ids),
            remaining=p.max_new_tokens,
        )
        self.admitted += 1

    @property
    def used_tokens(self) -> int:
        return self.capacity - self.free_tokens

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.free_tokens / self.capacity if self.capacity else 1.0

    def loads(self, busy: bool, guess_len: int) -> list[Load]:
        return [
            Load(p.held, estimated_remaining(p.max_new_tokens, p.output_tokens, busy or p.ignore_eos, guess_len))
            for p in self.placed.values()
        ]

    def peak_with(self, req: GenerateReq | None, busy: bool, guess_len: int) -> int:
        loads = self.loads(busy, guess_len)
        if req is not None:
            p = req.params
            loads.append(
                Load(len(req.input_ids), estimated_remaining(p.max_new_tokens, 0, busy or p.ignore_eos, guess_len))
            )
        return peak_tokens(loads)

    def held_tokens(self) -> int:
        """KV tokens its requests hold, or will hold once started or resumed, as far as the router knows."""
        return sum(p.held for p in self.placed.values())

    def backlog_tokens(self) -> int:
        """Tokens placed here that wait for a prefill, as far as we know: the prompts of requests
        with no output yet, and everything a paused request holds (it resumes by recomputation)."""
        return sum(p.held for p in self.placed.values() if p.output_tokens == 0 or p.paused)
