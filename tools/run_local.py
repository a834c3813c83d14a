"""The whole stack on this machine: an alias of ``lightstream serve`` (``--help`` lists its flags).

python tools/run_local.py [MODEL | --model-dir DIR] [--port 8000] [--tp N] [--dp G] ...
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lightstream.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
