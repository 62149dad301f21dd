"""`gpulease-singleuser`: JupyterHub's single-user server, as gpulease starts it.

The same `jupyterhub.singleuser` server `jupyterhub-singleuser` runs, with the
same arguments and environment; only jsonschema's RFC 3987 grammar is not
built at import (gpulease.skip_rfc3987_grammar), which saves about 1.5 s of
every server's start. The spawners run this script (spawners/local/process_spec.py).
"""

from __future__ import annotations

import sys

from gpulease import skip_rfc3987_grammar


def main() -> int:
    skip_rfc3987_grammar()
    from jupyterhub.singleuser import main as singleuser_main

    return singleuser_main() or 0


if __name__ == "__main__":
    sys.exit(main())
