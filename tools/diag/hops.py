"""A lone request's first-token hops from tools/diag/sitecustomize.py's LS_STAMPS files.

    python tools/diag/hops.py STAMPS_DIR

For each request the front end submitted with no other request within 50 ms, the times
between: the HTTP request's start, its submission, the front end's send, the router's read
and send, the worker's read, the start of the worker's next step, the worker's send of the
first token, the detokenizer's read and send, the front end's read, the hand-over to the
request's task and the first body chunk written; then the median, least and most of each.
Then the worker's two steps to the first token (the first step's start and end, the token
step's start and end), and the same for the engine alone where its stamps are in the folder
(LS_STAMPS set for bench_pipeline or benchmark_engine).
"""

from __future__ import annotations

import glob
import os
import statistics
import sys

Event = tuple[float, str, str, str]  # unix time, pid, event, detail


def load(stamps_dir: str) -> list[Event]:
    events: list[Event] = []
    for path in glob.glob(os.path.join(stamps_dir, "*.txt")):
        pid = os.path.basename(path)[:-4]
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split(" ", 2)
                if len(parts) >= 2:
                    events.append((float(parts[0]), pid, parts[1], parts[2] if len(parts) > 2 else ""))
    return sorted(events)


def first(events: list[Event], after: float, event: str, detail: str = "", pid: str = "") -> Event | None:
    for e in events:
        if e[0] >= after and e[2] == event and detail in e[3] and (not pid or e[1] == pid):
            return e
    return None


def chain(events: list[Event], t: float, front: str, rid: str) -> list[tuple[str, float]] | None:
    begin = max((e for e in events if e[1] == front and e[2] == "http_begin" and e[0] <= t), default=None)
    steps: list[tuple[str, Event | None]] = [("http_begin", begin), ("submit", (t, front, "", ""))]
    steps.append(("front_send", first(events, t, "send0", "GenerateReq:" + rid)))
    steps.append(("router_read", first(events, t, "read", "GenerateReq:" + rid)))
    steps.append(("router_send", first(events, t, "send0", "AdmitReqs:" + rid)))
    read = first(events, t, "read", "AdmitReqs:" + rid)
    steps.append(("worker_read", read))
    steps.append(("step_start", first(events, read[0], "step0", pid=read[1]) if read else None))
    steps.append(("worker_send", first(events, t, "send0", "TokenBatch:" + rid)))
    steps.append(("detok_read", first(events, t, "read", "TokenBatch:" + rid)))
    steps.append(("detok_send", first(events, t, "send0", "TextBatch:" + rid)))
    steps.append(("front_read", first(events, t, "read", "TextBatch:" + rid)))
    delivered = first(events, t, "delivered", rid)
    steps.append(("delivered", delivered))
    steps.append(("body_sent", first(events, delivered[0], "uv_send", "body", front) if delivered else None))
    if any(e is None for _, e in steps):
        return None
    return [(name, e[0]) for name, e in steps]  # type: ignore[index]


def steps_to_token(events: list[Event], pid: str, start: float) -> list[tuple[str, float]] | None:
    """From ``start``, the process's steps up to the first that returned a token: the first
    step's start and end, and the token step's start and end."""
    ends = [e for e in events if e[1] == pid and e[0] >= start and e[2] == "step1" and e[3] not in ("", "0")]
    if not ends:
        return None
    end = ends[0][0]
    starts = [e[0] for e in events if e[1] == pid and start <= e[0] <= end and e[2] == "step0"]
    first_end = [e[0] for e in events if e[1] == pid and start <= e[0] <= end and e[2] == "step1"]
    if len(starts) < 2:
        return None
    return [("step_a0", starts[0]), ("step_a1", first_end[0]), ("step_b0", starts[-1]), ("step_b1", end)]


def report(rows: list[list[tuple[str, float]]]) -> None:
    for i in range(1, len(rows[0])):
        ms = [1000 * (r[i][1] - r[i - 1][1]) for r in rows]
        name = f"{rows[0][i - 1][0]} -> {rows[0][i][0]}"
        print(f"{name:>28}  median {statistics.median(ms):7.3f}  least {min(ms):7.3f}  most {max(ms):7.3f} ms")
    total = [1000 * (r[-1][1] - r[0][1]) for r in rows]
    print(f"{rows[0][0][0] + ' -> ' + rows[0][-1][0]:>28}  median {statistics.median(total):7.3f} ms")


def engine_rows(events: list[Event]) -> list[list[tuple[str, float]]]:
    """The engine alone's requests (benchmark_engine's low-load part): add, then its steps."""
    rows = []
    for t, pid, _, _ in (e for e in events if e[1].startswith("engine-") and e[2] == "add"):
        steps = steps_to_token(events, pid, t)
        if steps is not None:
            rows.append([("add", t), *steps])
    return rows


def main(argv: list[str]) -> None:
    events = load(argv[0])
    submits = [(t, pid, detail) for t, pid, name, detail in events if name == "submit0"]
    times = [t for t, _, _ in submits]
    rows, worker_steps = [], []
    for t, front, rid in submits:
        if sum(1 for x in times if abs(x - t) < 0.05) == 1:  # alone
            row = chain(events, t, front, rid)
            if row is not None:
                rows.append(row)
                steps = steps_to_token(events, first(events, t, "read", "AdmitReqs:" + rid)[1], row[6][1])
                if steps is not None:
                    worker_steps.append([("worker_read", row[5][1]), *steps, ("worker_send", row[7][1])])
    print(f"lone requests: {len(rows)} of {len(submits)}")
    if rows:
        report(rows)
    if worker_steps:
        print(f"the worker's steps to a lone request's first token ({len(worker_steps)}):")
        report(worker_steps)
    alone = engine_rows(events)
    if alone:
        print(f"the engine alone's steps to a lone request's first token ({len(alone)}):")
        report(alone)


if __name__ == "__main__":
    main(sys.argv[1:])
