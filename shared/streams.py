"""Every Redis key and stream name, in one place.

A deployment can share one Redis between several LightStream stacks by giving each a
different namespace (``--namespace``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamNames:
    namespace: str = "ls"

    @property
    def visual(self) -> str:
        """VisualReq: requests with images, read by every visual replica (one consumer group)."""
        return f"{self.namespace}:visual"

    def image(self, image_hash: str) -> str:
        """An image's ImageEmbedding, under its content hash, with a time-to-live."""
        return f"{self.namespace}:img:{image_hash}"

    @property
    def router(self) -> str:
        """GenerateReq, AbortReq and WorkerStatus, read by the router."""
        return f"{self.namespace}:router"

    def worker(self, group: str) -> str:
        """AdmitReqs and AbortReqs for one worker group."""
        return f"{self.namespace}:worker:{group}"

    def detok(self, shard: str) -> str:
        """DetokRegister and TokenBatch for one detokenizer shard."""
        return f"{self.namespace}:detok:{shard}"

    def front(self, front_id: str) -> str:
        """TextBatch for one front end (tokenizer replica)."""
        return f"{self.namespace}:front:{front_id}"

    def placed(self, group: str) -> str:
        """A hash: a copy of each request placed on one worker group (shared/request_copies.py)."""
        return f"{self.namespace}:placed:{group}"

    def heartbeat(self, service: str, replica: str) -> str:
        return f"{self.namespace}:hb:{service}:{replica}"

    def heartbeat_pattern(self, service: str) -> str:
        return f"{self.namespace}:hb:{service}:*"

    def stream_pattern(self) -> str:
        return f"{self.namespace}:*"


def consumer_lease(stream: str, group: str, consumer: str) -> str:
    """A key each stream reader refreshes on every read; when it expires, the reader is dead
    and another consumer of the group may claim what it left pending."""
    return f"{stream}:lease:{group}:{consumer}"


# consumer group names, one per consuming service
GROUP_ROUTER = "router"
GROUP_WORKER = "worker"
GROUP_DETOK = "detokenizer"
GROUP_FRONT = "front"
GROUP_VISUAL = "visual"

# service names as they appear in heartbeats and logs
SERVICE_TOKENIZER = "tokenizer"
SERVICE_ROUTER = "router"
SERVICE_WORKER = "worker"
SERVICE_DETOK = "detokenizer"
SERVICE_VISUAL = "visual"
