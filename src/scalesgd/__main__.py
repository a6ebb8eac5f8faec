"""`python -m scalesgd` is the `scalesgd` command."""

import sys

from scalesgd.cli import main

if __name__ == "__main__":  # not where multiprocessing's fork server imports the main module to start its children
    sys.exit(main())
