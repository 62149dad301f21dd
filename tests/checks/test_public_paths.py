"""The dotted paths admins put in their configuration keep working as modules move.

A `jupyterhub_config.py` names spawners and authenticators by class path, the
console scripts and the `jupyterhub.authenticators` entry points name functions
and classes, and the docs name modules (`python -m gpulease.hub.service`). Moving
code inside the package (the issue "One way down") must not break any of them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What configurations and guides out there name: kept importable from these paths.
CONFIG_PATHS = [
    "gpulease.spawners.local.LocalGPUSpawner",
    "gpulease.spawners.kube.GPUKubeSpawner",
    "gpulease.hub.authenticator.LocalAccountsAuthenticator",
    "gpulease.hub.oauth_oidc.GPULeaseOIDCAuthenticator",
    "gpulease.hub.oauth_github.GPULeaseGitHubAuthenticator",
    "gpulease.hub.app.GPULeaseHub",
    "gpulease.hub.cli:main",
    "gpulease.singleuser.launch:main",
]
# A dotted name of the package in prose or config: a module, or an attribute of one.
DOTTED = re.compile(r"\bgpulease\.(?:hub|spawners|idle_culler|singleuser|images|core|host|store)"
                    r"(?:\.\w+)*(?::\w+)?")


def resolve(path: str) -> object:
    """The object a dotted path names ("pkg.mod.Class" or "pkg.mod:func")."""
    module, _, attribute = path.partition(":")
    parts = module.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in [*parts[split:], *([attribute] if attribute else [])]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(path)


@pytest.mark.parametrize("path", CONFIG_PATHS)
def test_the_paths_configurations_name_import(path):
    assert resolve(path) is not None


@pytest.mark.parametrize("old, new", [
    ("gpulease.hub.authenticator.LocalAccountsAuthenticator",
     "gpulease.hub.auth.local.LocalAccountsAuthenticator"),
    ("gpulease.hub.oauth_oidc.GPULeaseOIDCAuthenticator",
     "gpulease.hub.auth.oidc.GPULeaseOIDCAuthenticator"),
    ("gpulease.hub.oauth_github.GPULeaseGitHubAuthenticator",
     "gpulease.hub.auth.github.GPULeaseGitHubAuthenticator"),
])
def test_an_authenticators_old_path_is_the_same_class(old, new):
    """The modules left at the old paths re-export, never copy: one class, configured
    under one name (c.GPULeaseOIDCAuthenticator.*) whichever path a config uses."""
    assert resolve(old) is resolve(new)


def test_the_entry_points_and_scripts_resolve():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["scripts"].values(),
                *(target for group in project["entry-points"].values()
                  for target in group.values())]
    assert len(declared) >= 5, declared
    for target in declared:
        assert callable(resolve(target)), target
    installed = {e.value for e in importlib.metadata.entry_points(group="jupyterhub.authenticators")
                 if e.value.startswith("gpulease.")}
    assert installed == set(project["entry-points"]["jupyterhub.authenticators"].values())


def _image_files() -> list[Path]:
    """The images' Dockerfiles, scripts and configs (a server's command line is there)."""
    return [p for p in ROOT.glob("images/**/*") if p.is_file() and p.suffix != ".pyc"
            and "__pycache__" not in p.parts]


def test_every_dotted_path_the_docs_and_configs_name_resolves():
    files = sorted({ROOT / "README.md", ROOT / "jupyterhub_config.py",
                    *ROOT.glob("docs/**/*.md"), *ROOT.glob("*/README.md"),
                    *ROOT.glob("helm/**/*.yaml"), *ROOT.glob("helm/**/*.tpl"),
                    *ROOT.glob("helm/**/*.py"), *_image_files()})
    named = {(f.relative_to(ROOT), m.rstrip(".")) for f in files
             for m in DOTTED.findall(f.read_text())}
    assert len(named) > 20, named
    broken = []
    for where, path in sorted(named):
        try:
            resolve(path)
        except (ImportError, AttributeError) as e:
            broken.append(f"{where}: {path} ({e})")
    assert not broken, broken
