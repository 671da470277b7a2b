import sys

from memwal.jvm import main

sys.exit(main())
