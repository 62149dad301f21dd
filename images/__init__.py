"""Notebook images: Dockerfiles and the image catalog shipped with gpulease."""

from pathlib import Path

# The catalog shipped with the package; `catalog_file` replaces it.
CATALOG_PATH = Path(__file__).parent / "catalog.yaml"
