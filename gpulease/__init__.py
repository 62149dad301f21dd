"""gpulease: GPU notebook rental on JupyterHub.

The code lives in the top-level component folders (hub/, spawners/,
idle-culler/, singleuser/, images/), which pyproject.toml maps to the
subpackages of this namespace.
"""

__version__ = "0.1.0"
