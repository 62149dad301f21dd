"""Entry point of the gpulease hub service, started by the hub as a managed service."""

from gpulease import skip_rfc3987_grammar

skip_rfc3987_grammar()  # before JupyterHub (through the app) is imported

from gpulease.hub.service.app import main  # noqa: E402

main()
