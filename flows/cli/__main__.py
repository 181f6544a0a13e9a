"""`python -m flows.cli ARGS` is `geodp ARGS`."""

import gc
import sys

gc.disable()  # the CLI's own modules load without the garbage collector too (flows.cli.common.loading)

from flows.cli import main  # noqa: E402

sys.exit(main())
