"""Run a command with every CPU kept from halting: a SCHED_IDLE spinner on each.

    python tools/diag/keep_awake.py -- COMMAND [ARG...]

A spinner runs only when nothing else wants its CPU, so it takes no time from the
command's processes; but the CPU never halts, so a thread woken on it runs at once instead
of after the host wakes a halted virtual CPU (tools/diag/wake_cost.py measures both).
The exit status is the command's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

SPIN = (
    "import os\nos.sched_setaffinity(0, {{{cpu}}})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"
)


def start() -> list[subprocess.Popen]:
    """One spinner per CPU this process may run on; kill them to stop."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(cpu=cpu)]) for cpu in sorted(os.sched_getaffinity(0))]
    time.sleep(0.5)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    procs = start()
    try:
        return subprocess.call(argv)
    finally:
        stop(procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
