"""The image catalog: which notebook images exist and what they need.

Profiles name images from here; the spawner takes the container image (cluster
shape) or the Python environment (embedded shape) from the entry, and admission
compares `min_driver` with the node's driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import yaml

from gpulease.core.shown import shown
from gpulease.core.units import load_yaml

IMAGE_NAME = re.compile(r"[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?")
_KEYS = ("name", "image", "cuda", "min_driver", "frameworks", "description", "local_env")


@dataclass(frozen=True)
class Image:
    name: str
    image: str
    cuda: str | None
    min_driver: str | None
    frameworks: dict[str, str]
    description: str
    local_env: str | None

    def __hash__(self) -> int:  # frameworks is a dict; the name identifies an entry
        return hash((self.name, self.image))


@dataclass(frozen=True)
class Catalog:
    images: tuple[Image, ...]

    def get(self, name: str) -> Image | None:
        return next((image for image in self.images if image.name == name), None)

    def names(self) -> tuple[str, ...]:
        return tuple(image.name for image in self.images)

    def offered(self, images: tuple[str, ...]) -> tuple[str, ...]:
        """The image names a profile offers: its own, or (none named) the catalog's first."""
        return images or self.names()[:1]


class CatalogError(ValueError):
    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def _text(value: object) -> str | None:
    # Unquoted versions such as `cuda: 12.6` load as exact Decimals; their text is the version.
    if isinstance(value, str):
        return value
    if isinstance(value, Decimal) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return None


def _optional_text(entry: dict, key: str, where: str, errors: list[str]) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    text = _text(value)
    if text is None or not text:
        errors.append(f"{where}: {key} must be a non-empty string, got {shown(value)}")
    return text or None


def _parse_image(entry: object, where: str, errors: list[str]) -> Image | None:
    if not isinstance(entry, dict):
        errors.append(f"{where}: each image is a mapping, got {shown(entry)}")
        return None
    before = len(errors)
    unknown = sorted(str(key) for key in entry if key not in _KEYS)
    if unknown:
        errors.append(f"{where}: unknown keys {', '.join(unknown)}; allowed: {', '.join(_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not IMAGE_NAME.fullmatch(name):
        errors.append(f"{where}: name is required: lower-case letters, digits, '-', '.', '_'"
                      f" (got {shown(name)})")
    image = entry.get("image")
    if not isinstance(image, str) or not image.strip():
        errors.append(f"{where}: image (the container image reference) is required")
    frameworks = entry.get("frameworks") or {}
    if not isinstance(frameworks, dict) or not all(
        isinstance(k, str) and _text(v) for k, v in frameworks.items()
    ):
        errors.append(f"{where}: frameworks maps names to versions, got {shown(frameworks)}")
        frameworks = {}
    description = entry.get("description", "")
    if not isinstance(description, str):
        errors.append(f"{where}: description must be a string")
    cuda = _optional_text(entry, "cuda", where, errors)
    min_driver = _optional_text(entry, "min_driver", where, errors)
    local_env = _optional_text(entry, "local_env", where, errors)
    if len(errors) > before:
        return None
    return Image(
        name=name, image=image, cuda=cuda, min_driver=min_driver,
        frameworks={k: str(_text(v)) for k, v in frameworks.items()},
        description=description, local_env=local_env,
    )


def parse_catalog(data: object, source: str = "catalog") -> Catalog:
    """Validate a loaded catalog document, collecting every problem."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise CatalogError([f"{source}: must be a mapping with a list under 'images'"])
    errors: list[str] = []
    extra = sorted(str(key) for key in data if key != "images")
    if extra:
        errors.append(f"{source}: unknown top-level keys {', '.join(extra)}; allowed: images")
    images: list[Image] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(data["images"]):
        where = f"{source}: images[{index}]"
        image = _parse_image(entry, where, errors)
        if image is None:
            continue
        if image.name in seen:
            first = seen[image.name]
            errors.append(f"{where}: duplicate name {shown(image.name)} (also images[{first}])")
            continue
        seen[image.name] = index
        images.append(image)
    if errors:
        raise CatalogError(errors)
    return Catalog(tuple(images))


def load_catalog(path: str | Path) -> Catalog:
    """Load and validate a catalog file (gpulease.images.shipped_catalog: the shipped one)."""
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CatalogError([f"{path}: not valid YAML: {exc}"]) from exc
    return parse_catalog(data, str(path))
