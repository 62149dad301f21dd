"""gpulease: GPU notebook rental on JupyterHub.

The components live in the top-level folders (hub/, spawners/, idle-culler/,
singleuser/, images/), which pyproject.toml maps to the subpackages of this
namespace; the shared layers below them (core/, store/, host/) and a few modules
any component may import (process_exit, sign_in_failure, site_urls) live here
(docs/architecture.md).
"""

import sys
from pkgutil import extend_path

# An environment copied from an editable install (gpulease.hub.config.server_env) holds the
# subpackages in its site-packages: found there too when the source tree's gpulease/
# comes first on sys.path (an interpreter started in the clone's folder).
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"


def skip_rfc3987_grammar() -> None:
    """Keep jsonschema from building its RFC 3987 grammar parser in this process.

    jsonschema, which JupyterHub and jupyter-server import through
    jupyter_events, builds that parser as it is imported whenever
    rfc3987_syntax is installed: about 1.5 s of CPU at every hub, service,
    CLI and notebook server start, only to check the "iri" string format,
    which no schema gpulease, JupyterHub or jupyter-server loads uses.
    Without it jsonschema leaves "iri" unchecked (it imports the module under
    suppress(ImportError)); every other format is checked as before. Called
    before JupyterHub or jupyter-server is imported, by each entry point: the
    `gpulease` command's `up`, the service's and the culler's `__main__`, and
    `gpulease-singleuser` (gpulease.singleuser.launch) and the warm launcher. Kernels are other
    processes and untouched.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
