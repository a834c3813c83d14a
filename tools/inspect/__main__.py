"""python -m tools.inspect: what a running LightStream is doing, read from its Redis (read-only).

    python -m tools.inspect [--redis-url URL] [--namespace NS] [--json] [--watch SECONDS]

The report is tools/inspect_report.py. tools/inspect/ is a namespace package on purpose (no
__init__.py): a script run as `python tools/<name>.py` has tools/ first on sys.path, and a
regular package or module named inspect there would hide the standard library's `inspect`
from everything the script imports; a namespace package never wins over a regular module.
"""

from __future__ import annotations

import sys

from tools.inspect_report import main

sys.exit(main())
