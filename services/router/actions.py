"""What one round of the router's policy decides (RouterCore's output, carried out by the
service), and the router's counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.messages import GenerateReq, TokenItem


@dataclass
class Actions:
    admits: dict[tuple[str, str], list[GenerateReq]] = field(default_factory=dict)  # (group, instance) -> reqs
    admit_seqs: dict[tuple[str, str], int] = field(default_factory=dict)
    aborts: dict[str, list[str]] = field(default_factory=dict)  # group -> rids
    ended: dict[str, list[TokenItem]] = field(default_factory=dict)  # detok shard -> final items
    released: list[str] = field(default_factory=list)  # rids that left the waiting queue
    # requests of a dead group, each to its detokenizer shard, which sends it back to go on: (req, why)
    handovers: list[tuple[GenerateReq, str]] = field(default_factory=list)
    # (group, rid): requests that ended on a group or left it: their copies there can go
    forgotten: list[tuple[str, str]] = field(default_factory=list)

    def end(self, detok: str, rid: str, prompt_tokens: int, reason: str, error: str = "", kind: str = "") -> None:
        item = TokenItem(
            rid=rid, token_ids=[], finish_reason=reason, error=error, error_kind=kind, prompt_tokens=prompt_tokens
        )
        self.ended.setdefault(detok, []).append(item)

    def abort(self, group: str, rid: str) -> None:
        self.aborts.setdefault(group, []).append(rid)

    @property
    def empty(self) -> bool:
        return not (self.admits or self.aborts or self.ended or self.released or self.handovers)


@dataclass
class RouterStats:
    admitted: dict[str, int] = field(default_factory=dict)  # group -> requests placed there
    routed: dict[tuple[str, bool], int] = field(default_factory=dict)  # (group, prefix hit) -> requests placed
    rejected: dict[str, int] = field(default_factory=dict)  # error kind -> requests
    requeued: int = 0
    failed: int = 0
    aborted: int = 0
