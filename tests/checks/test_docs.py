"""The docs stay true: every option gpulease defines is in docs/config.md."""

import re
from pathlib import Path

import pytest

from gpulease.hub.auth.github import GPULeaseGitHubAuthenticator
from gpulease.hub.auth.local import LocalAccountsAuthenticator
from gpulease.hub.auth.oauth import ProviderSignIn
from gpulease.hub.auth.oidc import GPULeaseOIDCAuthenticator
from gpulease.hub.config.app_options import GPULeaseOptions
from gpulease.singleuser.activity_push import ActivityPusher
from gpulease.singleuser.kernel_pool import PooledKernelManager
from gpulease.spawners.local.server_output import ServerOutput
from gpulease.spawners.local.spawner import LocalGPUSpawner
from gpulease.spawners.start.admission_options import AdmissionOptions

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cls, section_name", [
    (GPULeaseOptions, "GPULeaseHub"),  # GPULeaseHub's own options live in this mixin
    (LocalGPUSpawner, "LocalGPUSpawner"),
    (AdmissionOptions, "LocalGPUSpawner"),  # its queue and per-user limit options
    (ServerOutput, "LocalGPUSpawner"),  # its log's rotation
    (LocalAccountsAuthenticator, "LocalAccountsAuthenticator"),
    (ProviderSignIn, "ProviderSignIn"),
    (GPULeaseOIDCAuthenticator, "GPULeaseOIDCAuthenticator"),
    (GPULeaseGitHubAuthenticator, "GPULeaseGitHubAuthenticator"),
    (PooledKernelManager, "PooledKernelManager"),
    (ActivityPusher, "ActivityPusher"),
])
def test_every_option_is_documented_with_help(cls, section_name):
    doc = (ROOT / "docs" / "config.md").read_text()
    section = doc.split(f"## {section_name}", 1)[1].split("\n## ", 1)[0]
    for name, trait in cls.class_own_traits(config=True).items():
        assert trait.help, f"{cls.__name__}.{name} has no help text"
        assert f"`{name}`" in section, f"{cls.__name__}.{name} missing from docs/config.md"


def test_readme_opens_with_the_two_commands():
    head = (ROOT / "README.md").read_text()[:1500]
    assert "make run" in head and "make test" in head


def test_the_architecture_page_is_linked_and_names_modules_that_exist():
    """docs/architecture.md is the project's own design page: the README links it, and
    every module it names by its path (`gpulease/core/capacity/queue.py`) exists."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert "(docs/architecture.md)" in (root / "README.md").read_text()
    page = (root / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:hub|spawners|idle-culler|singleuser|gpulease)/[\w/]+\.py)`",
                           page))
    assert len(named) > 15, named
    missing = sorted(path for path in named if not (root / path).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


# A repository path as the docs write it: in backticks or as a link's target, under one of
# the project's folders ("`gpulease/core/capacity/queue.py`", "[testing](docs/testing.md)").
REPO_PATH = re.compile(
    r"(?:`|\]\()((?:\.ci|hub|spawners|idle-culler|singleuser|gpulease|images|helm|tests|bench"
    r"|docs|scripts)/[\w./-]*[\w/])(?=[`)#]|\s)")


def test_every_repository_path_the_docs_name_exists():
    """A module moved or a script renamed leaves no dangling path in the README, docs/,
    or a component's README (a link relative to its page counts)."""
    pages = sorted({ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("*/README.md")})
    named = [(page, path) for page in pages for path in REPO_PATH.findall(page.read_text())]
    assert len(named) > 150, len(named)
    missing = sorted(f"{page.relative_to(ROOT)}: {path}" for page, path in named
                     if not (ROOT / path).exists() and not (page.parent / path).exists()
                     and not built(path))
    assert not missing, f"paths the docs name that do not exist: {missing}"


def built(path: str) -> bool:
    """A path git ignores: a build's output (tests/cluster/tools/bin/), there once built."""
    import subprocess

    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def test_the_readme_is_a_newcomers_page_that_stays_in_the_repository():
    """One paragraph, the two commands, the spawn page's picture, a feature table and
    links: short, and every link a path of this repository (the prose lives in docs/)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 120, len(text.splitlines())
    assert "](docs/images/hub-spawn.png)" in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert len(links) > 15, links
    outside = [link for link in links if "://" in link or link.startswith(("..", "/"))]
    assert not outside, outside
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, missing
