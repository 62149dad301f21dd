"""The alert rules (helm/gpulease/files/alerts.yaml, both shapes' rules file): checked
and unit-tested with `promtool` (built from the Go module proxy by `make
cluster-tools`) on the synthetic series of tests/alerts/gpulease_test.yaml; and the
chart's monitoring objects (PrometheusRule, ServiceMonitor, the Grafana dashboard),
checked structurally, since kubernetes-validate has no schema for custom resources."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.helm import CHART, find, one, render

ROOT = Path(__file__).resolve().parents[2]
RULES = CHART / "files" / "alerts.yaml"
CASES = ROOT / "tests" / "alerts" / "gpulease_test.yaml"
PROMTOOL = ROOT / "tests" / "cluster" / "tools" / "bin" / "promtool"
ALERTS = {"GPUOverheat", "GpuleaseServersStuckPending", "GpuleaseCreditEnforcementFailing",
          "GpuleaseMeteringHeartbeatFailing", "GpuleaseCullerNotRunning"}
MONITORING = ("monitoring.enabled=true", "monitoring.tokenSecret=metrics-token")


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    if not PROMTOOL.exists():
        message = f"promtool is not built ({PROMTOOL}): run `make cluster-tools` (needs Go)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_the_rules_file_checks():
    run = promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr
    assert {r["alert"] for r in rules()} == ALERTS


def test_each_alert_fires_when_it_should_and_not_otherwise():
    run = promtool("test", "rules", str(CASES))
    assert run.returncode == 0, run.stdout + run.stderr
    cases = yaml.safe_load(CASES.read_text())["tests"]
    checks = [c for t in cases for c in t["alert_rule_test"]]
    for alert in ALERTS:  # each has a case where it fires and one where it does not
        outcomes = {bool(c["exp_alerts"]) for c in checks if c["alertname"] == alert}
        assert outcomes == {True, False}, alert


@pytest.mark.parametrize(("alert", "before", "after"), [
    ("GPUOverheat", "> 85\n", "> 95\n"),
    ("GpuleaseServersStuckPending", "> 600", "> 6000"),
    ("GpuleaseCullerNotRunning", "> 900", "> 9000"),
])
def test_a_changed_threshold_fails_the_cases(tmp_path, alert, before, after):
    """The cases can fail: the rules with one threshold moved do not pass them."""
    (tmp_path / "helm" / "gpulease" / "files").mkdir(parents=True)
    text = RULES.read_text()
    assert before in text
    (tmp_path / "helm" / "gpulease" / "files" / "alerts.yaml").write_text(
        text.replace(before, after))
    (tmp_path / "tests" / "alerts").mkdir(parents=True)
    shutil.copy(CASES, tmp_path / "tests" / "alerts")
    run = promtool("test", "rules", "tests/alerts/gpulease_test.yaml", cwd=tmp_path)
    assert run.returncode != 0 and alert in run.stdout + run.stderr, run.stdout


def test_the_prometheusrule_carries_the_rules_file():
    objects = render(None, *MONITORING)
    (rule,) = find(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert not find(render(None), "PrometheusRule")  # monitoring off by default


def test_the_servicemonitor_scrapes_the_hub_and_the_culler_with_a_token():
    objects = render(None, *MONITORING, "hub.baseUrl=/gpu/")
    (monitor,) = find(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    paths = [e["path"] for e in monitor["spec"]["endpoints"]]
    assert paths == ["/gpu/hub/metrics", "/gpu/services/gpulease-culler/metrics"]
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] == "http"
        assert endpoint["authorization"]["credentials"] == {"name": "metrics-token",
                                                            "key": "token"}
    selector = monitor["spec"]["selector"]["matchLabels"]
    public = one(objects, "Service", "gp-proxy-public")
    assert selector.items() <= public["metadata"]["labels"].items()


def test_the_dashboard_is_grafana_json_over_gpuleases_metrics():
    objects = render(None, *MONITORING)
    config = one(objects, "ConfigMap", "gp-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["gpulease.json"])
    assert dashboard["uid"] == "gpulease" and dashboard["panels"]
    documented = (ROOT / "docs" / "monitoring.md").read_text()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = re.findall(r"\b(?:gpulease|DCGM)_[A-Za-z_]+", target["expr"])
            assert names, target
            for name in names:
                assert f"`{name}" in documented, f"{name} is not in docs/monitoring.md"
