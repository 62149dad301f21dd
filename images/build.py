"""Build and tag gpulease's images in dependency order, with docker or podman.

    images/build.sh [--engine docker|podman] [--registry HOST/PATH] [--push] [--dry-run]

The plan (PLAN) names, for each image, its Dockerfile and build arguments; the
notebook images are the catalog's entries (images/catalog.yaml, whose `image`
references are the tags), the hub image is not in the catalog. An image whose
FROM is another image of the plan is built after it. Every build runs from the
repository root, the context the Dockerfiles' COPY expects.

tests/checks/test_images.py checks the plan and the Dockerfiles statically (the build
machines run no container engine).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CATALOG = HERE / "catalog.yaml"
REGISTRY = "registry.example.org/gpulease"  # the catalog's references start with it
HUB_IMAGE = f"{REGISTRY}/hub:0.1.0"


@dataclass(frozen=True)
class Build:
    name: str  # the catalog entry's name (or "hub")
    dockerfile: str  # relative to images/
    args: dict[str, str] = field(default_factory=dict)


PLAN = (
    Build("hub", "hub/Dockerfile"),
    Build("cuda", "cuda/Dockerfile", {"CUDA_VERSION": "12.6.3", "CUDA_MIN_DRIVER": "560.28"}),
    Build("cuda-12.8", "cuda/Dockerfile",
          {"CUDA_VERSION": "12.8.1", "CUDA_MIN_DRIVER": "570.124"}),
    Build("pytorch", "pytorch/Dockerfile", {"BASE": f"{REGISTRY}/cuda:12.6"}),
    Build("tensorrt-llm", "tensorrt-llm/Dockerfile", {"BASE": f"{REGISTRY}/cuda:12.8"}),
)


def references() -> dict[str, str]:
    """Each planned image's tag: the catalog's reference (the hub's is HUB_IMAGE)."""
    entries = yaml.safe_load(CATALOG.read_text(encoding="utf-8"))["images"]
    tags = {e["name"]: e["image"] for e in entries}
    return {b.name: HUB_IMAGE if b.name == "hub" else tags[b.name] for b in PLAN}


def ordered(plan: tuple[Build, ...], tags: dict[str, str]) -> list[Build]:
    """The plan with each image after the one its BASE argument names."""
    by_tag = {tags[b.name]: b for b in plan}
    done: list[Build] = []

    def visit(build: Build, path: tuple[str, ...] = ()) -> None:
        if build in done:
            return
        if build.name in path:
            raise ValueError(f"images/build.py: a FROM cycle through {' -> '.join(path)}")
        base = by_tag.get(build.args.get("BASE", ""))
        if base is not None:
            visit(base, path + (build.name,))
        done.append(build)
    for build in plan:
        visit(build)
    return done


def commands(engine: str, registry: str, push: bool) -> list[list[str]]:
    tags = references()
    swap = (lambda ref: registry + ref[len(REGISTRY):]) if registry != REGISTRY else str
    out = []
    for build in ordered(PLAN, tags):
        argv = [engine, "build", "--file", str(HERE / build.dockerfile),
                "--tag", swap(tags[build.name])]
        for key, value in build.args.items():
            argv += ["--build-arg", f"{key}={swap(value) if key == 'BASE' else value}"]
        out.append(argv + [str(ROOT)])
        if push:
            out.append([engine, "push", swap(tags[build.name])])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="images/build.sh", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("docker", "podman"),
                        default="docker" if shutil.which("docker") else "podman")
    parser.add_argument("--registry", default=REGISTRY,
                        help=f"where the tags point instead of {REGISTRY}")
    parser.add_argument("--push", action="store_true", help="push each image once built")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    for command in commands(args.engine, args.registry.rstrip("/"), args.push):
        print("+", " ".join(command), flush=True)
        if not args.dry_run:
            if subprocess.run(command).returncode != 0:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
