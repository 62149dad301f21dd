"""gpulease.hub: the hub's configuration, CLI, profiles, accounts, billing and its service."""

from gpulease import skip_rfc3987_grammar

skip_rfc3987_grammar()  # before JupyterHub is imported anywhere in the hub's processes
