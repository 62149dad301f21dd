"""`python -m gpulease.hub.cli`: the `gpulease` command, as its console script runs it."""

import sys

from gpulease.hub.cli.commands import main

sys.exit(main())
