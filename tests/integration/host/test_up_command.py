"""`gpulease up` as an admin meets it: options, bad files, config layering."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpulease.hub.app import GPULeaseHub


def run_up(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpulease.hub.cli", "up", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
        env={**os.environ, "GPULEASE_ADMIN_PASSWORD": "x" * 12},
    )


def test_help_all_lists_gpulease_options_with_help():
    out = run_up("--help-all").stdout
    for option in (
        "--GPULeaseHub.state_dir", "--GPULeaseHub.profiles_file", "--GPULeaseHub.inventory_file",
        "--GPULeaseHub.admin_name", "--GPULeaseHub.billing_db_url",
        "--LocalGPUSpawner.inventory_file", "--LocalGPUSpawner.state_dir",
        "--LocalAccountsAuthenticator.max_failures", "--LocalAccountsAuthenticator.lockout_seconds",
    ):
        assert option in out, option
    assert "The state folder" in out


BAD_PROFILES = """\
profiles:
  - slug: h200-1g
    display_name: Slice
    gpu: {model: H200, mig: 1g.10gb}
    cpu: 4
    memory: 32Gi
    images: [pytorch]
    price_per_hour: "-1"
  - slug: h200-1g
    display_name: Again
    cpu: 1
    memory: 12Zi
    images: [no-such-image]
    price_per_hour: "1"
    idle_timeout: 5 minutes
"""


def test_invalid_profiles_file_stops_up_listing_every_problem(tmp_path):
    bad = tmp_path / "profiles.yaml"
    bad.write_text(BAD_PROFILES)
    result = run_up(f"--state={tmp_path / 's'}", f"--profiles={bad}")
    assert result.returncode != 0
    err = result.stderr
    assert "cannot start" in err
    for needle in ("gpu.mig", "1g.18gb", "price_per_hour", "duplicate", "memory",
                   "no-such-image", "idle_timeout", str(bad)):
        assert needle in err, f"{needle!r} missing from:\n{err}"


def test_an_admin_name_outside_the_rule_stops_up(tmp_path):
    result = run_up(f"--state={tmp_path / 's'}", "--admin=Admin")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "cannot start" in result.stderr
    assert "user name 'Admin' is not allowed" in result.stderr
    assert "^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_inventory_file_stops_up(tmp_path):
    bad = tmp_path / "inventory.yaml"
    bad.write_text("nodes:\n  - name: box\n    gpus:\n      - {model: H200, mig: [1g.5gb]}\n")
    result = run_up(f"--state={tmp_path / 's'}", f"--inventory={bad}")
    assert result.returncode != 0
    assert "1g.5gb" in result.stderr and "nodes[0].gpus[0].mig[0]" in result.stderr


def test_world_readable_state_folder_is_refused(tmp_path):
    state = tmp_path / "s"
    (state / "private").mkdir(parents=True)
    os.chmod(state / "private", 0o755)
    result = run_up(f"--state={state}")
    assert result.returncode != 0
    assert "chmod 700" in result.stderr


def test_user_config_file_wins_over_gpulease_defaults(tmp_path):
    config = tmp_path / "my_config.py"
    config.write_text("c.JupyterHub.cleanup_servers = False\nc.LocalGPUSpawner.node_name = 'mine'\n"
                      # in-process, as root, this interpreter may be out of per-user accounts'
                      # reach (tests/support/isolation_env.py); their checks: tests/e2e/test_isolation.py
                      "c.GPULeaseHub.per_user_accounts = False\n")
    app = GPULeaseHub(state_dir=str(tmp_path / "s"), config_file=str(config))
    try:
        app.load_config_file()
        assert app.config.JupyterHub.cleanup_servers is False
        assert app.config.LocalGPUSpawner.node_name == "mine"
        # gpulease's own defaults still fill in what the file does not set
        assert app.config.JupyterHub.spawner_class.endswith("LocalGPUSpawner")
        assert app.config.LocalGPUSpawner.state_dir == str((tmp_path / "s").resolve())
    finally:
        GPULeaseHub.clear_instance()


@pytest.mark.parametrize("ip,warned", [("127.0.0.1", False), ("0.0.0.0", True), ("::", True)])
def test_loopback_detection(ip, warned):
    from gpulease.hub.web.origins import is_loopback

    assert is_loopback(ip) is not warned


def test_a_hub_beyond_loopback_without_a_subdomain_host_refuses_to_start(tmp_path):
    # Its users' servers would share the hub's origin: a page one of them serves could
    # act as an admin who opens it (hub/web/origins.py). The message names both ways out.
    result = run_up(f"--state={tmp_path / 's'}", "--ip=0.0.0.0", "--port=1")
    assert result.returncode == 1, result.stderr[-2000:]
    err = result.stderr
    assert "cannot start" in err and "--ip 0.0.0.0" in err
    assert "--subdomain-host https://gpu.example.org" in err
    assert "GPULeaseHub.allow_shared_origin = True" in err
    assert "Traceback" not in err
    assert not (tmp_path / "s" / "private" / "gpulease.sqlite").exists()  # nothing written


def test_a_bad_subdomain_host_is_refused_naming_what_is_allowed(tmp_path):
    result = run_up(f"--state={tmp_path / 's'}", "--subdomain-host=https://10.0.0.5:8000")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "is an IP address, which has no subdomains" in result.stderr
    assert "expected https://DOMAIN or http://localhost:PORT" in result.stderr
