"""The Helm chart (helm/gpulease) as the tests use it: `helm` built from Go modules by
`make cluster-tools` (tests/cluster/tools/helm), rendered values files, the objects."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpulease"
HELM = ROOT / "tests" / "cluster" / "tools" / "bin" / "helm"
VALUES_FILES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE, NAMESPACE = "gp", "gpulease"


def require_helm() -> Path:
    if HELM.exists():
        return HELM
    message = f"helm is not built ({HELM}): run `make cluster-tools` (needs Go 1.26)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def helm(*args: str, env: dict | None = None, check: bool = True
         ) -> subprocess.CompletedProcess:
    run = subprocess.run([str(require_helm()), *args], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})
    if check and run.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{run.stdout}{run.stderr}")
    return run


# The one value an install of the defaults must add: the domain of the users' servers
# (USER.gpu.example.org), which nothing in the defaults can say; the chart refuses an
# install without it (or hub.allowSharedOrigin).
A_DOMAIN = "hub.subdomainHost=https://gpu.example.org"


def values_args(values: Path | None, sets: tuple[str, ...] = ()) -> list[str]:
    """helm's arguments for a values file and --set overrides; None: the defaults, with
    A_DOMAIN unless the overrides say how the users' servers are served."""
    if values is None and not any(s.startswith(("hub.subdomainHost=", "hub.allowSharedOrigin="))
                                  for s in sets):
        sets = (A_DOMAIN, *sets)
    return [*(["-f", str(values)] if values else []), *(f"--set={s}" for s in sets)]


def render(values: Path | None = None, *sets: str) -> list[dict]:
    """The chart's objects for `values` (None: the defaults and A_DOMAIN) and --set
    overrides."""
    out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE,
               *values_args(values, sets)).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def values_of(values: Path | None) -> dict:
    """The values the chart sees: its defaults, with the file laid over (maps merged);
    None: the defaults with A_DOMAIN, as render(None) has them."""
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    if values is not None:
        _merge(merged, yaml.safe_load(values.read_text()))
    else:
        merged["hub"]["subdomainHost"] = A_DOMAIN.split("=", 1)[1]
    return merged


def _merge(into: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = find(objects, kind, name)
    return found
