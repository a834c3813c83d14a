"""Streams trimmed by what has been consumed, not only by length.

An entry every consumer group of its stream has been handed and has acknowledged is of no
more use: ``trim_consumed`` removes the entries older than the oldest one some group still
needs (its oldest pending entry, or past the last one it was handed), in one server-side
script (XTRIM MINID, exact), so a stream holds about what is in flight and Redis's memory
follows the load instead of the history. A stream no group reads yet is left alone (its
entries wait for their first reader). XADD's MAXLEN (shared/redis_streams.py) stays as the
bound for a stream nobody consumes.

The script also sets the stream to expire ``idle_ttl_ms`` from now: each reader runs it
every second or so, so only a stream whose readers are all gone (a front end or a
detokenizer shard replaced under a new name) expires, with what it held.
"""

from __future__ import annotations

from typing import Any

# KEYS[1]: the stream; ARGV[1]: the expiry in ms. -> entries removed (-1: the stream has no group)
TRIM_SCRIPT = """
local function parse(id)
  local ms, seq = string.match(id, "^(%d+)-(%d+)$")
  return tonumber(ms), tonumber(seq)
end
local function older(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end
if redis.call("EXISTS", KEYS[1]) == 0 then return 0 end
local groups = redis.call("XINFO", "GROUPS", KEYS[1])
if #groups == 0 then return -1 end
local keep = nil
for _, g in ipairs(groups) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local need = info["last-delivered-id"]
  if tonumber(info["pending"]) > 0 then
    need = redis.call("XPENDING", KEYS[1], info["name"])[2]
  end
  if keep == nil or older(need, keep) then keep = need end
end
redis.call("PEXPIRE", KEYS[1], ARGV[1])
return redis.call("XTRIM", KEYS[1], "MINID", keep)
"""

IDLE_TTL_MS = 3_600_000  # an hour without a reader: nobody will read it again


def trim_consumed(client: Any, stream: str, idle_ttl_ms: int = IDLE_TTL_MS) -> Any:
    """Run the trim on a redis-py or redis.asyncio client (awaitable with the latter): -> the
    entries removed, -1 when no group reads the stream yet."""
    return client.eval(TRIM_SCRIPT, 1, stream, idle_ttl_ms)
