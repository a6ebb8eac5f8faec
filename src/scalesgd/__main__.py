"""`python -m scalesgd` is the `scalesgd` command."""

import sys

from scalesgd.cli import main

sys.exit(main())
