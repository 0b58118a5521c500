"""``python -m autoopt`` runs the CLI."""

import sys

from autoopt.cli import main

sys.exit(main())
