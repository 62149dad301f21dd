"""The images, checked statically: no container engine runs on the build machines.

images/check.py holds the rules; each test here breaks one rule in a copy of a
real Dockerfile and shows that the check says so, so that none can pass by
checking nothing."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import jupyterhub
import pytest
import yaml

from gpulease.images import shipped_catalog
from gpulease.images.build import HERE, PLAN, REGISTRY, commands, ordered, references
from gpulease.images.check import parse, problems

ROOT = Path(__file__).resolve().parents[2]
CATALOG_ENTRIES = yaml.safe_load((HERE / "catalog.yaml").read_text())["images"]


def text(name: str) -> str:
    build = next(b for b in PLAN if b.name == name)
    return (HERE / build.dockerfile).read_text()


def broken(name: str, old: str, new: str) -> list[str]:
    assert old in text(name), f"{old!r} is not in the {name} Dockerfile any more"
    return problems(texts={name: text(name).replace(old, new)})


def test_every_dockerfile_parses_and_every_check_holds():
    for build in PLAN:
        assert parse(build).parents, build.name
    assert problems() == []
    done = subprocess.run([sys.executable, str(HERE / "check.py")], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "every check holds" in done.stdout


def test_every_catalog_entry_is_built_and_the_catalog_loads():
    assert {e.name for e in shipped_catalog().images} <= {b.name for b in PLAN}
    missing = CATALOG_ENTRIES + [{"name": "jax", "image": f"{REGISTRY}/jax:1", "cuda": "12.6"}]
    assert "jax: in the catalog but not built by images/build.py" in problems(catalog=missing)


def test_the_build_order_puts_each_base_first_and_the_tags_are_the_catalogs():
    tags = references()
    names = [b.name for b in ordered(tuple(reversed(PLAN)), tags)]
    assert names.index("cuda") < names.index("pytorch")
    assert names.index("cuda-12.8") < names.index("tensorrt-llm")
    built = [argv[argv.index("--tag") + 1] for argv in commands("podman", REGISTRY, False)]
    assert set(built) == set(tags.values())
    assert {e["image"] for e in CATALOG_ENTRIES} <= set(built)
    moved = commands("docker", "ghcr.io/lab/gpulease", push=True)
    assert all(REGISTRY not in " ".join(argv) for argv in moved)
    assert ["docker", "push", "ghcr.io/lab/gpulease/cuda:12.6"] in moved
    looped = (dataclasses.replace(PLAN[3], args={"BASE": tags["tensorrt-llm"]}),
              dataclasses.replace(PLAN[4], args={"BASE": tags["pytorch"]}))
    with pytest.raises(ValueError, match="FROM cycle"):
        ordered(looped, tags)


def test_the_build_script_runs_as_documented():
    done = subprocess.run([str(HERE / "build.sh"), "--dry-run", "--engine", "podman"],
                          capture_output=True, text=True, env={"PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(PLAN) and all(line.startswith("+ podman build") for line in lines)


def test_the_notebook_images_pin_the_hubs_jupyterhub():
    assert f"jupyterhub=={jupyterhub.__version__}" in text("hub")  # the hub this repo tests
    said = broken("cuda", f"jupyterhub=={jupyterhub.__version__}", "jupyterhub==5.2.1")
    assert f"cuda: jupyterhub==5.2.1 is not the hub image's {jupyterhub.__version__}" in said
    assert any(p.startswith("pytorch: jupyterhub==5.2.1") for p in said)  # inherited


def test_the_notebook_images_install_gpulease_singleuser():
    said = broken("cuda", " \\\n && /opt/notebook/bin/python -m gpulease.singleuser.install", "")
    assert any(p.startswith("cuda: gpulease.singleuser is not installed") for p in said)


@pytest.mark.parametrize("name, old, new", [
    ("cuda", "USER 1000", "USER root"),
    ("pytorch", "USER 1000", "USER 0"),
    ("hub", "USER 1000", ""),
])
def test_the_final_user_is_not_root(name, old, new):
    assert any(p.startswith(f"{name}: the final USER is") for p in broken(name, old, new))


@pytest.mark.parametrize("name, old, new, said", [
    ("cuda", "nvidia/cuda:${CUDA_VERSION}-base-ubuntu24.04", "nvidia/cuda:latest",
     "must name a fixed tag"),
    ("cuda", "nvidia/cuda:${CUDA_VERSION}-base-ubuntu24.04", "nvidia/cuda",
     "must name a fixed tag"),
    ("hub", "python:3.11.11-slim-bookworm AS build", "python AS build", "must name a fixed tag"),
    ("pytorch", "FROM ${BASE}", f"FROM {REGISTRY}/cuda:13.0", "is no image built before it"),
])
def test_from_is_pinned_and_resolves_inside_the_catalog(name, old, new, said):
    assert any(p.startswith(f"{name}: FROM") and said in p for p in broken(name, old, new))


def test_the_labels_agree_with_the_catalog():
    said = broken("pytorch", "torch=2.6.0", "torch=2.5.1")
    assert any(p.startswith("pytorch: label org.gpulease.frameworks=torch=2.5.1") for p in said)
    wrong = [dict(e, min_driver="550.54") if e["name"] == "cuda" else e for e in CATALOG_ENTRIES]
    assert any(p.startswith("cuda: label org.gpulease.driver.min=560.28 is not")
               for p in problems(catalog=wrong))
    wrong = [dict(e, cuda="12.4") if e["name"] == "pytorch" else e for e in CATALOG_ENTRIES]
    assert any(p.startswith("pytorch: label org.gpulease.cuda.version=12.6.3")  # inherited
               for p in problems(catalog=wrong))


def test_no_latest_anywhere_and_a_workflow_builds_them():
    for path in HERE.glob("*/Dockerfile"):
        assert ":latest" not in path.read_text(), path
    workflow = yaml.safe_load((ROOT / ".github/workflows/images.yml").read_text())
    steps = " ".join(str(s.get("run", "")) for job in workflow["jobs"].values()
                     for s in job["steps"])
    assert "images/check.py" in steps and "images/build.sh" in steps


def test_checking_a_changed_copy_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the parser, given no path, would write ./Dockerfile
    assert broken("pytorch", "USER 1000", "USER 0") and list(tmp_path.iterdir()) == []
