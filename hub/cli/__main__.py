"""`python -m gpulease.hub.cli`: the `gpulease` command, as its console script runs it."""

import sys

from gpulease.hub.cli import main

sys.exit(main())
