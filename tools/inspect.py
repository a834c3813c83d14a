"""python -m tools.inspect: what a running LightStream is doing, read from its Redis (read-only).

    python -m tools.inspect [--redis-url URL] [--namespace NS] [--json] [--watch SECONDS]

The report is tools/inspect_report.py; this file names the command and keeps the name
``inspect`` from hiding the standard library's module (see below).
"""

from __future__ import annotations

import os
import sys

if __name__ == "inspect":
    # A script run as `python tools/<name>.py` has tools/ first on sys.path, so the standard
    # library's `import inspect` (made by dataclasses, torch and many more) finds this file.
    # Import the real module with tools/ left out and leave it in sys.modules: the import
    # system hands the caller whatever sys.modules holds once this file has run.
    _here = os.path.realpath(os.path.dirname(__file__))
    _saved = sys.path[:]
    sys.path[:] = [p for p in _saved if os.path.realpath(p or os.curdir) != _here]
    del sys.modules["inspect"]
    try:
        import inspect  # noqa: F401 (the standard library's, now in sys.modules)
    finally:
        sys.path[:] = _saved
elif __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: make the repository root importable
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tools.inspect_report import main

    sys.exit(main())
