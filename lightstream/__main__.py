"""``python -m lightstream serve ...``: the same entry point as the ``lightstream`` command."""

import sys

from lightstream.cli import main

sys.exit(main())
