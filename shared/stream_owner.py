"""Which process reads a stream that one process at a time must read (a detokenizer shard's: the
state of its requests lives in the process that read their registrations).

The owner holds a key (``<stream>:owner``) with its name and a short expiry, refreshed on every
turn of its loop; a process that stops refreshing it (dead, frozen) loses it, and another may
take it and the stream's pending entries over (StreamReader.take_over). ``hold`` takes the key
when it is free and keeps it when it is ours, in one step.
"""

from __future__ import annotations

from shared.redis_link import RedisLink, maybe
from shared.streams import StreamNames

# KEYS[1]: the owner key; ARGV: our name, the expiry in ms. -> 1 when we hold it now, else 0
HOLD_SCRIPT = """
local owner = redis.call("GET", KEYS[1])
if owner == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
  return 1
end
if owner then return 0 end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return 1
"""

# KEYS[1]: the owner key; ARGV[1]: our name. Deleted only if ours.
RELEASE_SCRIPT = """
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0
"""


class StreamOwner:
    # as long as a consumer's lease (shared/redis_streams.py): a process starved of the CPU for a
    # moment on a loaded host keeps its stream
    def __init__(self, link: RedisLink, stream: str, name: str, ttl_ms: int = 5_000) -> None:
        self.link = link
        self.key = f"{stream}:owner"
        self.name = name
        self.ttl_ms = ttl_ms

    def hold(self) -> bool:
        """Take the stream if nobody holds it, keep it if we do: -> whether we hold it now."""
        return bool(self.link.call(lambda r: r.eval(HOLD_SCRIPT, 1, self.key, self.name, self.ttl_ms)))

    def holder(self) -> str:
        """Who holds it ("" when nobody does)."""
        return maybe(self.link.call(lambda r: r.get(self.key))) or ""

    def release(self) -> None:
        self.link.call(lambda r: r.eval(RELEASE_SCRIPT, 1, self.key, self.name))


def shard_streams(link: RedisLink, names: StreamNames) -> list[str]:
    """Every detokenizer shard's stream in this namespace, live shards' or not."""
    prefix = names.detok("")
    keys = link.call(lambda r: list(r.scan_iter(match=prefix + "*", _type="stream", count=1000)))
    return sorted(k for k in (maybe(k) for k in keys) if ":" not in k[len(prefix) :])
