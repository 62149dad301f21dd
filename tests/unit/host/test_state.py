import os
import stat

import pytest

from gpulease.host.state import StateError, ensure_home, prepare_state_dir, read_or_create_secret


def test_layout_and_modes(tmp_path):
    state = prepare_state_dir(tmp_path / "s")
    assert stat.S_IMODE(state.private.stat().st_mode) == 0o700
    assert stat.S_IMODE(state.homes.stat().st_mode) == 0o755
    home = ensure_home(state, "alice")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_refuses_a_private_folder_others_can_read(tmp_path):
    state = prepare_state_dir(tmp_path / "s")
    os.chmod(state.private, 0o755)
    with pytest.raises(StateError, match="chmod 700"):
        prepare_state_dir(tmp_path / "s")


def test_secrets_are_created_once_and_private(tmp_path):
    state = prepare_state_dir(tmp_path / "s")
    first = read_or_create_secret(state.private / "t")
    assert first == read_or_create_secret(state.private / "t")
    assert len(first) == 64
    assert stat.S_IMODE((state.private / "t").stat().st_mode) == 0o600
