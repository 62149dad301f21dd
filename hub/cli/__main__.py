"""`python -m gpulease.hub.cli`: the `gpulease` command, as its console script runs it."""

import sys

from gpulease.hub.cli.main import main

sys.exit(main())
