"""``python -m gpdyn ...``: the ``gpdyn`` command, for a Python whose scripts are not on PATH."""

from gpdyn.cli import main

raise SystemExit(main())
