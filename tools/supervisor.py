"""Keep a stack's processes running, as ``lightstream serve`` does: a process that exits is
logged, reaped and started again after a backoff that doubles with each exit (1 s up to 30 s)
and starts again from 1 s once a run has lasted a minute. Compose's restart policies do the
same for containers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Child:
    """One supervised process: how to see it and how to start it again."""

    name: str
    proc: Callable[[], subprocess.Popen | None]  # the current process (None: never started)
    restart: Callable[[], None]


@dataclass(frozen=True)
class Backoff:
    first_s: float = 1.0
    most_s: float = 30.0
    stable_s: float = 60.0  # a run this long starts the backoff again from first_s


@dataclass
class _Watch:
    started: float
    delay_s: float
    restart_at: float | None = None  # set while it waits to be started again


def _say(line: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} lightstream serve: {line}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(
        self,
        children: list[Child],
        stopping: threading.Event,
        backoff: Backoff = Backoff(),
        poll_s: float = 0.2,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.children = children
        self.stopping = stopping
        self.backoff = backoff
        self.poll_s = poll_s
        self.say = say
        self.restarts: dict[str, int] = {c.name: 0 for c in children}
        now = time.monotonic()
        self._watch = {c.name: _Watch(now, backoff.first_s) for c in children}
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def join(self) -> None:
        """After stopping is set: returns once no restart can happen any more."""
        self._thread.join()

    def _run(self) -> None:
        while not self.stopping.wait(self.poll_s):
            for child in self.children:
                if self.stopping.is_set():
                    return
                self._look_after(child, time.monotonic())

    def _look_after(self, child: Child, now: float) -> None:
        w = self._watch[child.name]
        if w.restart_at is None:
            proc = child.proc()
            if proc is None or proc.poll() is None:  # poll() reaps an exited process: no zombie
                return
            ran = now - w.started
            if ran >= self.backoff.stable_s:
                w.delay_s = self.backoff.first_s
            self.say(f"{child.name} exited with status {proc.returncode} after {ran:.1f}s; again in {w.delay_s:g}s")
            w.restart_at = now + w.delay_s
            w.delay_s = min(2 * w.delay_s, self.backoff.most_s)
        elif now >= w.restart_at:
            try:
                child.restart()
            except Exception as e:  # it could not even start (redis-server's port taken, ...): try again later
                self.say(f"{child.name} could not be started again ({type(e).__name__}: {e})")
                w.restart_at = now + w.delay_s
                w.delay_s = min(2 * w.delay_s, self.backoff.most_s)
                return
            w.started, w.restart_at = now, None
            self.restarts[child.name] += 1
            proc = child.proc()
            self.say(f"{child.name} started again (pid {proc.pid if proc else '?'})")
