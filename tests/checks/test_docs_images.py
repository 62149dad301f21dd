"""The pictures in the README and docs exist, and the screenshots `make screenshots`
takes (scripts/screenshots.py) are all there and all used."""

from __future__ import annotations

import importlib.util
import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = re.compile(r"\.(png|jpe?g|gif|svg|webp)$", re.I)
# [text](target) and ![alt](target "title"); <img src="target">
MD_LINK = re.compile(r"""!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?"""
                     r"""(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)""")
HTML_IMG = re.compile(r"<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.I)


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def image_links(page: Path) -> list[str]:
    """The local images a Markdown page shows or links, as written there."""
    text = page.read_text()
    targets = MD_LINK.findall(text) + HTML_IMG.findall(text)
    return [t for t in targets
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)  # http:, data:, mailto:
            and IMAGE.search(t.split("#")[0].split("?")[0])]


def missing_images(pages: list[Path], root: Path = ROOT) -> list[str]:
    out = []
    for page in pages:
        for target in image_links(page):
            path = (page.parent / target.split("#")[0].split("?")[0]).resolve()
            if not path.is_file() or not path.is_relative_to(root.resolve()):
                out.append(f"{page.relative_to(root)}: {target}")
    return out


def test_every_image_the_docs_reference_exists():
    assert not missing_images(doc_files())


def test_the_check_finds_a_missing_image(tmp_path):
    (tmp_path / "docs" / "images").mkdir(parents=True)
    (tmp_path / "docs" / "images" / "here.png").write_bytes(b"png")
    (tmp_path / "README.md").write_text(
        "![here](docs/images/here.png) ![gone](docs/images/gone.png 'a title')\n"
        "[a link to one](docs/images/also-gone.jpg) [a page](docs/user.md)\n"
        '<img src="docs/images/img-gone.svg"> ![remote](https://example.org/x.png)\n')
    (tmp_path / "docs" / "user.md").write_text("![up](../docs/images/here.png)\n"
                                               "![out](../../elsewhere.png)\n")
    assert missing_images(doc_files(tmp_path), tmp_path) == [
        "README.md: docs/images/gone.png", "README.md: docs/images/also-gone.jpg",
        "README.md: docs/images/img-gone.svg", "docs/user.md: ../../elsewhere.png"]


def screenshot_pages() -> list[str]:
    spec = importlib.util.spec_from_file_location("screenshots",
                                                  ROOT / "scripts" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.PAGES)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_every_screenshot_is_committed_small_and_used():
    used = {(page.parent / t).resolve() for page in doc_files() for t in image_links(page)}
    for name in screenshot_pages():
        path = ROOT / "docs" / "images" / f"{name}.png"
        assert path.is_file(), f"{path.name} missing: run `make screenshots`"
        assert png_size(path) == (1280, 800), path.name
        assert path.stat().st_size < 300 * 1024, path.name
        assert path.resolve() in used, f"no page of the docs shows {path.name}"
