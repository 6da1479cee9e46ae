"""`python -m evald` runs the same command line as the `evald` script."""

import sys

from evald.cli import main

sys.exit(main())
