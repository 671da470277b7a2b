"""``python -m memwal`` runs the CLI."""

import sys

from memwal.cli import main

sys.exit(main())
