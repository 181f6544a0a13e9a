"""`python -m flows.cli ARGS` is `geodp ARGS`."""

import sys

from flows.cli import main

sys.exit(main())
