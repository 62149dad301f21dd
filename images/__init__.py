"""Notebook images: Dockerfiles and the image catalog shipped with gpulease."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulease.core.model.catalog import Catalog

# The catalog shipped with the package; `catalog_file` replaces it.
CATALOG_PATH = Path(__file__).parent / "catalog.yaml"


def shipped_catalog() -> Catalog:
    """The catalog shipped with gpulease, loaded and checked. (The rules that read a
    catalog are core's, which knows no file of its own: this package names the file.)"""
    from gpulease.core.model.catalog import load_catalog

    return load_catalog(CATALOG_PATH)
