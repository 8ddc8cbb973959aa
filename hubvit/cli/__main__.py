"""`python -m hubvit.cli ...`: the `hubvit` command, where its console script is not on the PATH."""

import sys

from . import main

sys.exit(main())
