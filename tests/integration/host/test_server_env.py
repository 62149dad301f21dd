"""Where a root hub keeps what per-user accounts must reach: the state folder's default and
the copy of the servers' environment (gpulease.host.state, gpulease.hub.config.server_env).
The whole path, `make run` from a clone in a 0700 folder: tests/checks/test_fresh_clone.py."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from gpulease.host.state import SHARED_STATE_BASE, default_state_root
from gpulease.hub.config.server_env import ServerEnvError, _mirror, build, editable_packages
from tests.support.isolation_env import shared_tmpdir

ROOT = Path(__file__).resolve().parents[3]


def test_state_stays_in_the_clone_when_the_accounts_can_pass_or_need_not(tmp_path):
    closed = tmp_path / "home"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    assert default_state_root(closed, accounts_must_reach=False) == closed.resolve() / ".gpulease"
    opened = shared_tmpdir("open-")  # 0711, and every folder above lets others pass
    try:
        assert default_state_root(opened, accounts_must_reach=True) == opened / ".gpulease"
    finally:
        opened.rmdir()


def test_state_of_a_clone_the_accounts_cannot_pass_goes_to_var_lib_one_per_clone(tmp_path):
    home = tmp_path / "root"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    one, two = home / "gpulease", home / "other" / "gpulease"
    one.mkdir()
    two.mkdir(parents=True)
    first = default_state_root(one, accounts_must_reach=True)
    assert first.parent == SHARED_STATE_BASE and first.name.startswith("gpulease-")
    assert default_state_root(one, accounts_must_reach=True) == first  # the same clone: kept
    assert default_state_root(two, accounts_must_reach=True) != first  # two clones never share


def test_the_mirror_links_copies_refreshes_and_drops(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("A = 1\n")
    private = src / "pkg" / "data.bin"
    private.write_text("x")
    private.chmod(0o600)  # an install under umask 077
    (src / "node_modules").mkdir()  # a built labextension's npm tree: never copied
    (src / "gone.py").write_text("")
    (src / "__editable__.finder.py").write_text("")
    (dst / "kept").mkdir(parents=True)  # filled by another mirror
    (src / "docs").mkdir()
    (src / "docs" / "api.yml").write_text("openapi: 3.1.0\n")
    (src / "pkg" / "api.yml").symlink_to("../docs/api.yml")  # as hub/service/rest-api.yml is
    _mirror(src, dst, keep={"kept"}, skip_prefix="__editable__")
    assert (dst / "pkg" / "api.yml").read_text() == "openapi: 3.1.0\n"  # not a dangling link
    assert not (dst / "pkg" / "api.yml").is_symlink()

    assert os.stat(dst / "pkg" / "mod.py").st_ino == os.stat(src / "pkg" / "mod.py").st_ino
    assert stat.S_IMODE(os.stat(dst / "pkg" / "data.bin").st_mode) & 0o004  # readable by all
    assert stat.S_IMODE(os.stat(dst / "pkg").st_mode) == 0o755
    assert not (dst / "node_modules").exists() and not (dst / "__editable__.finder.py").exists()

    (src / "gone.py").unlink()
    new = src / "pkg" / "mod.py.new"  # an editor's save: a new file in its place
    new.write_text("A = 2\n")
    os.replace(new, src / "pkg" / "mod.py")
    _mirror(src, dst, keep={"kept"}, skip_prefix="__editable__")
    assert (dst / "pkg" / "mod.py").read_text() == "A = 2\n"
    assert not (dst / "gone.py").exists()
    assert (dst / "kept").is_dir()


def test_the_editable_install_names_every_subpackage_from_pyproject():
    packages = editable_packages()
    if not packages:
        return  # a normal install: the packages are in site-packages, mirrored with it
    assert packages["gpulease.hub"] == ROOT / "hub"
    assert packages["gpulease.idle_culler"] == ROOT / "idle-culler"
    assert all(folder.is_dir() for folder in packages.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a folder to another account")
def test_no_copy_is_made_in_a_folder_or_through_a_lock_another_account_controls():
    """In a folder everyone may write (the tests' /tmp), an account that made the copy's
    folder first could change its packages once `build` filled it: code the hub run from
    it (as root, in the tests) or every server would run. `build` refuses, naming it."""
    parent = shared_tmpdir("env-")
    try:
        theirs = parent / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)  # nobody's
        with pytest.raises(ServerEnvError, match=r"theirs belongs to uid 65534"):
            build(theirs)
        assert list(theirs.iterdir()) == []  # nothing was put in it

        open_to_all = parent / "open"
        open_to_all.mkdir()
        open_to_all.chmod(0o777)
        with pytest.raises(ServerEnvError, match=r"open belongs to uid 0 \(mode 777\)"):
            build(open_to_all)

        (parent / ".linked.lock").symlink_to(parent / "elsewhere")
        with pytest.raises(ServerEnvError, match=r"\.linked\.lock: Too many levels"):
            build(parent / "linked")
        assert not (parent / "elsewhere").exists()
    finally:
        shutil.rmtree(parent)
