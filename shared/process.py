"""Process-wide settings every service applies at start, from its __main__."""

from __future__ import annotations

import sys

# Python hands the interpreter lock between threads every 5 ms by default. Each service
# passes messages between threads (a Redis reader, a sender, the event loop or the step
# loop), and every hand-off waited up to that long: on an H200 the pipeline added 7 ms to a
# lone request's time to first token. A shorter interval costs a little switching.
SWITCH_INTERVAL_S = 0.0005


def tune_interpreter() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
