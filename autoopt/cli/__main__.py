"""``python -m autoopt.cli`` runs the CLI, as ``python -m autoopt`` does."""

import sys

from autoopt.cli import main

sys.exit(main())
