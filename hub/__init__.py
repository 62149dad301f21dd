"""gpulease.hub: the hub process (its configuration, app and tasks), the `gpulease` CLI,
sign-in, metering, and the gpulease service (service/).

Importing it does nothing: each entry point makes its own start-up calls (the
`gpulease` command and the service's and culler's `__main__` skip jsonschema's
RFC 3987 parser before JupyterHub is imported: gpulease.skip_rfc3987_grammar).
"""
