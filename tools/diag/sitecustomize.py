"""Host-side diagnostics for the services, loaded by Python at start-up when this folder is on
PYTHONPATH (it patches classes from outside; nothing here is imported by LightStream).

    LS_PROF=DIR    the worker (and a benchmark_engine or bench_pipeline process) adds up the
                   wall time per (thread, function) of its step loop, Redis threads, message
                   encoding and garbage collection, and writes DIR/<role>-<pid>.json every 5 s
    LS_POLL=1      every stream read that would block polls instead (reads without BLOCK until an
                   entry comes or the wait is over): how much of a hop is the wake from sleep
    LS_NO_TICK=1   the front end's event loop does not tick while its reads poll (Pipeline._keep_awake)
    LS_PIN=1       each process of a bench_pipeline job on a physical core of its own (all of the
                   core's hardware threads): the worker, redis-server, each front end, the router,
                   the detokenizer, and the benchmark's client (which runs the engine alone after
                   the stack): whether neighbours on a process's CPUs slow its hops
    LS_STAMPS=DIR  every service appends "unix-time event detail" lines to DIR/<pid>.txt when a
                   stream read returns, a send starts and ends, a step starts and ends, and the
                   front end takes, submits and answers a request (tools/diag/hops.py reads them);
                   in a benchmark_engine or bench_pipeline process, the engine alone's steps and adds

Used for docs/benchmarks.md r24 (why a lone request's first token takes longer through the
pipeline than through the engine alone).
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib
import json
import os
import sys
import threading
import time

with open("/proc/self/cmdline", "rb") as _f:
    _CMD = _f.read().replace(b"\0", b" ").decode()
_LOCK = threading.Lock()


def _wrap(mod: str, cls: str, meth: str, before, after) -> None:
    c = getattr(importlib.import_module(mod), cls)
    f = getattr(c, meth)

    @functools.wraps(f)
    def g(*a, **k):
        t = before(a)
        out = f(*a, **k)
        after(t, a, out)
        return out

    setattr(c, meth, g)


def _profile(out_dir: str) -> None:
    acc: dict[tuple[str, str], list] = {}
    t0 = time.time()
    role = "worker" if "services.worker" in _CMD else "engine"
    path = os.path.join(out_dir, f"{role}-{os.getpid()}.json")

    def add(label: str, dt: float) -> None:
        with _LOCK:
            v = acc.setdefault((threading.current_thread().name, label), [0, 0.0])
            v[0] += 1
            v[1] += dt

    def dump() -> None:
        with _LOCK:
            out = {"wall": time.time() - t0, "acc": {f"{k[0]}|{k[1]}": v for k, v in acc.items()}}
        with open(path, "w") as f:
            json.dump(out, f, indent=0)

    def every_5s() -> None:
        while True:
            time.sleep(5)
            dump()

    atexit.register(dump)
    threading.Thread(target=every_5s, daemon=True).start()
    for mod, cls, meth in [
        ("services.worker.engine", "Engine", "step"),
        ("services.worker.engine", "Engine", "_launch"),
        ("services.worker.engine", "Engine", "_collect"),
        ("services.worker.engine", "Engine", "running_reqs"),
        ("services.worker.service", "WorkerService", "publish_status"),
        ("services.worker.service", "WorkerService", "_publish_tokens"),
        ("services.worker.service", "WorkerService", "_take"),
        ("services.worker.io_threads", "Inbox", "drain"),
        ("services.worker.io_threads", "Outbox", "send"),
        ("shared.redis_streams", "StreamWriter", "send_many"),
        ("shared.redis_streams", "StreamReader", "read"),
        ("services.worker.model_runner", "ModelRunner", "forward"),
        ("services.worker.scheduler", "Scheduler", "schedule"),
    ]:
        label = f"{cls}.{meth}"
        _wrap(
            mod,
            cls,
            meth,
            lambda a: time.perf_counter(),
            lambda t, a, o, label=label: add(label, time.perf_counter() - t),
        )
    messages = importlib.import_module("shared.messages")
    streams = importlib.import_module("shared.redis_streams")
    encode = messages.encode

    def timed_encode(msg):
        t = time.perf_counter()
        data = encode(msg)
        add("encode:" + type(msg).__name__, time.perf_counter() - t)
        return data

    messages.encode = streams.encode = timed_encode
    started: dict[str, float] = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            add(f"gc{info['generation']}", time.perf_counter() - started.pop("t"))

    gc.callbacks.append(on_gc)
    _wrap("torch.cuda", "Event", "synchronize", lambda a: time.perf_counter(),
          lambda t, a, o: add("Event.synchronize", time.perf_counter() - t))  # fmt: skip


def _poll() -> None:
    streams = importlib.import_module("shared.redis_streams")
    read = streams.StreamReader.read

    def polled(self, count=256, block_ms=None):
        if not block_ms:
            return read(self, count, block_ms)
        end = time.monotonic() + block_ms / 1000
        while True:
            out = read(self, count, None)
            if out or time.monotonic() >= end:
                return out

    streams.StreamReader.read = polled


def _stamps(out_dir: str) -> None:
    f = open(os.path.join(out_dir, f"{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115 (open for the process's life)

    def stamp(name: str, info: str = "") -> None:
        with _LOCK:
            f.write(f"{time.time():.6f} {name} {info}\n")

    def rid(msg) -> str:
        if hasattr(msg, "rid"):
            return f"{type(msg).__name__}:{msg.rid}"
        for field in ("reqs", "items"):
            xs = getattr(msg, field, None)
            if xs:
                return f"{type(msg).__name__}:{xs[0].rid}"
        return type(msg).__name__

    def after_read(t, a, out) -> None:
        if out:
            stamp("read", a[0].stream + " " + ",".join(rid(e.msg) for e in out[:3]))

    _wrap("shared.redis_streams", "StreamReader", "read", lambda a: None, after_read)
    _wrap("shared.redis_streams", "StreamReader", "entries_of", lambda a: None, after_read)  # the loop's polls
    streams = importlib.import_module("shared.redis_streams")
    send_many = streams.StreamWriter.send_many

    def stamped_send(self, items, acks=(), **kw):
        items, acks = list(items), list(acks)
        stamp("send0", ",".join(rid(m) for _, m in items[:3]) + f" acks={len(acks)}")
        send_many(self, items, acks, **kw)
        stamp("send1")

    streams.StreamWriter.send_many = stamped_send
    if "services.worker" in _CMD:
        _wrap("services.worker.engine", "Engine", "step", lambda a: stamp("step0"),
              lambda t, a, o: stamp("step1", str(sum(1 for _, it in o.items if it.token_ids))))  # fmt: skip
    if "services.tokenizer" in _CMD:
        pipeline = importlib.import_module("services.tokenizer.pipeline")
        submit = pipeline.Pipeline.submit

        async def stamped_submit(self, request_id, *a, **k):
            stamp("submit0", request_id)
            return await submit(self, request_id, *a, **k)

        pipeline.Pipeline.submit = stamped_submit
        hand_out = pipeline.Pipeline._hand_out

        def stamped_hand_out(self, entries):
            if entries:
                stamp("delivered", ",".join(rid(e.msg) for e in entries[:3]))
            return hand_out(self, entries)

        pipeline.Pipeline._hand_out = stamped_hand_out
        http = importlib.import_module("uvicorn.protocols.http.httptools_impl")
        _wrap("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol", "on_message_begin",
              lambda a: stamp("http_begin"), lambda t, a, o: None)  # fmt: skip
        send = http.RequestResponseCycle.send

        async def stamped_http_send(self, message):
            await send(self, message)
            stamp("uv_send", message.get("type"))

        http.RequestResponseCycle.send = stamped_http_send


def _engine_stamps(out_dir: str) -> None:
    """The engine alone's steps (benchmark_engine's low-load part), stamped as the worker's are,
    with each request's add: hops.py compares a lone request's steps in both."""
    f = open(os.path.join(out_dir, f"engine-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115

    def stamp(name: str, info: str = "") -> None:
        f.write(f"{time.time():.6f} {name} {info}\n")

    _wrap("services.worker.engine", "Engine", "add", lambda a: stamp("add", a[1].rid), lambda t, a, o: None)
    _wrap("services.worker.engine", "Engine", "step", lambda a: stamp("step0"),
          lambda t, a, o: stamp("step1", str(sum(1 for _, it in o.items if it.token_ids))))  # fmt: skip


def _cores() -> list[list[int]]:
    """The host's physical cores, each as its CPUs (hardware threads), in order."""
    seen: dict[str, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        key = str(cpu)
        if os.path.exists(path):
            with open(path) as f:
                key = f.read().strip()
        seen.setdefault(key, []).append(cpu)
    return list(seen.values())


PIN_ROLES = ["worker", "redis", "front-0", "front-1", "router", "detok", "client"]  # core 1 on; core 0 is the system's


def _pin_cpus(role: str) -> set[int]:
    cores = _cores()
    return set(cores[(1 + PIN_ROLES.index(role)) % len(cores)])


def _pin() -> None:
    roles = {"services.worker": "worker", "services.router": "router", "services.detokenizer": "detok",
             "front-0": "front-0", "front-1": "front-1", "bench_pipeline": "client"}  # fmt: skip
    role = next((r for key, r in roles.items() if key in _CMD), None)
    if role is None:
        return
    os.sched_setaffinity(0, _pin_cpus(role))
    if role == "client":  # redis-server is started by this process
        redis_server = importlib.import_module("tools.redis_server")
        start = redis_server.RedisServer.start

        def pinned_start(self):
            out = start(self)
            os.sched_setaffinity(self.proc.pid, _pin_cpus("redis"))
            return out

        redis_server.RedisServer.start = pinned_start


if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())  # the services' modules, for a tool started as a script
if os.environ.get("LS_PROF") and any(s in _CMD for s in ("services.worker", "benchmark_engine", "bench_pipeline")):
    os.makedirs(os.environ["LS_PROF"], exist_ok=True)
    _profile(os.environ["LS_PROF"])
if os.environ.get("LS_PIN"):
    _pin()
if os.environ.get("LS_POLL") and "services." in _CMD:
    _poll()
if os.environ.get("LS_NO_TICK") and "services.tokenizer" in _CMD:

    async def _no_tick(self) -> None:
        return None

    importlib.import_module("services.tokenizer.pipeline").Pipeline._keep_awake = _no_tick
if os.environ.get("LS_STAMPS") and "services." in _CMD:
    os.makedirs(os.environ["LS_STAMPS"], exist_ok=True)
    _stamps(os.environ["LS_STAMPS"])
elif os.environ.get("LS_STAMPS") and any(s in _CMD for s in ("benchmark_engine", "bench_pipeline")):
    os.makedirs(os.environ["LS_STAMPS"], exist_ok=True)
    _engine_stamps(os.environ["LS_STAMPS"])
