import sys

from gpdyn.cli import main

sys.exit(main())
