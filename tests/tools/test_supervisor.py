"""tools/supervisor.py with real processes: a killed one is reaped, logged and started again;
one that keeps exiting waits longer each time; none is restarted once the stack stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from tests.polling import until
from tools.supervisor import Backoff, Child, Supervisor

QUICK = Backoff(first_s=0.1, most_s=0.4, stable_s=30.0)


class Proc:
    """A process run as ``python -c code``, started again by restart()."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.procs: list[subprocess.Popen] = []
        self.restart()

    def restart(self) -> None:
        self.procs.append(subprocess.Popen([sys.executable, "-c", self.code]))

    def current(self) -> subprocess.Popen:
        return self.procs[-1]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return False  # reaped: gone


def test_a_killed_process_is_reaped_logged_and_started_again() -> None:
    lines: list[str] = []
    stopping = threading.Event()
    sleeper = Proc("import time; time.sleep(60)")
    sup = Supervisor([Child("router", sleeper.current, sleeper.restart)], stopping, QUICK, 0.02, lines.append).start()
    try:
        first = sleeper.current()
        os.kill(first.pid, signal.SIGKILL)
        until(lambda: len(sleeper.procs) == 2, 10, "the killed process started again")
        assert not _zombie(first.pid)
        assert sup.restarts == {"router": 1}
        assert f"router exited with status {-signal.SIGKILL}" in lines[0] and "again in 0.1s" in lines[0], lines
        assert lines[1] == f"router started again (pid {sleeper.current().pid})"
    finally:
        stopping.set()
        sup.join()
        for p in sleeper.procs:
            p.kill()
            p.wait()


def test_a_process_that_keeps_exiting_is_restarted_ever_later_and_not_after_the_stop() -> None:
    lines: list[str] = []
    stopping = threading.Event()
    crasher = Proc("raise SystemExit(3)")
    sup = Supervisor([Child("worker-0", crasher.current, crasher.restart)], stopping, QUICK, 0.02, lines.append)
    sup.start()
    until(lambda: sup.restarts["worker-0"] >= 4, 20, "four restarts")
    stopping.set()
    sup.join()
    done = len(crasher.procs)
    time.sleep(0.6)
    assert len(crasher.procs) == done  # nothing started after the stop
    waits = [line.rsplit("again in ", 1)[1] for line in lines if "exited with status 3" in line]
    assert waits[:4] == ["0.1s", "0.2s", "0.4s", "0.4s"], lines
    for p in crasher.procs:
        p.wait(5)
        assert not _zombie(p.pid)
