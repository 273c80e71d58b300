"""`python3 -m guard CONFIG`: the guard's loop (run.py)."""

import sys

from .run import main

sys.exit(main(sys.argv[1:]))
