"""``python -m memwal.jvm``: fetches the JVM artifacts (what ``make`` runs before Spark starts)."""

import sys

from memwal.jvm import main

sys.exit(main())
