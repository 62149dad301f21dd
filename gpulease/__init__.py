"""gpulease: GPU notebook rental on JupyterHub.

The code lives in the top-level component folders (hub/, spawners/,
idle-culler/, singleuser/, images/), which pyproject.toml maps to the
subpackages of this namespace.
"""

from pkgutil import extend_path

# An environment copied from an editable install (gpulease.hub.server_env) holds the
# subpackages in its site-packages: found there too when the source tree's gpulease/
# comes first on sys.path (an interpreter started in the clone's folder).
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
