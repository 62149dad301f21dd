"""The hub's configuration: its options (traitlets), the JupyterHub config it assembles,
the cluster shape's choices, the isolation check and the servers' environment."""
