"""gpulease.hub: the hub's configuration, CLI, profiles, accounts, billing and its service."""

import sys

# jsonschema, which JupyterHub imports through jupyter_events, builds an RFC 3987
# grammar parser as it is imported whenever rfc3987_syntax is installed: about
# 1.5 s of CPU at every hub, service and CLI start, only to check the "iri"
# string format, which no schema gpulease or JupyterHub loads uses. Without
# it jsonschema simply leaves "iri" unchecked (it imports it under
# suppress(ImportError)). Servers and kernels are other processes: untouched.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
