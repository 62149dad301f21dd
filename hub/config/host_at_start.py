"""The host's side of `gpulease up`: each server's sandbox set up, the hub's own ports
checked free, and both undone when the start is refused.

A mixin of GPULeaseHub (hub/app.py), which calls `_setup_sandbox` while it prepares
its settings and `_refuse_taken_ports` first thing in `start`, before anything is
started or any secret sent.
"""

from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

from gpulease.hub.config import sandbox_setup
from gpulease.hub.config.port_check import previous_proxy_runs, taken_ports
from gpulease.spawners.local.isolation import hub_tag
from gpulease.spawners.local.sandbox import pool_for


class HostAtStart:
    """GPULeaseHub's host preparation (its attributes are JupyterHub's and gpulease's)."""

    def _setup_sandbox(self, state, service_port: int) -> sandbox_setup.SandboxPlan:
        """Each server's sandbox (hub/config/sandbox_setup.py): on where the host can."""
        if self._cluster:  # pods: Kubernetes keeps them apart (docs/cluster.md)
            return sandbox_setup.SandboxPlan(None, ())
        hub_port = urlsplit(self.hub_bind_url).port if self.hub_bind_url else self.hub_port
        return sandbox_setup.setup(
            mode=self.server_sandbox, tag=hub_tag(str(state.root)), pool=self.sandbox_network,
            egress=self.server_egress, blocked=list(self.server_egress_blocked),
            host_ports=[hub_port, service_port], state_root=state.root,
            is_root=os.geteuid() == 0, accounts=bool(self._isolation.unix_accounts),
            resolv_source=self.sandbox_resolv_conf)

    def _refuse_taken_ports(self) -> None:
        """Before anything starts or any secret is sent: each of the hub's own ports is
        free, else the hub stops here, naming the port and its setting (JupyterHub
        would hand its proxy token to whatever listens on the proxy's API port)."""
        hub_url = urlsplit(self.hub_bind_url) if self.hub_bind_url else None
        api = urlsplit(self.proxy.api_url)
        s = self._settings
        wanted = [
            ("the proxy's public port (--port, --ip)", self.ip or "0.0.0.0", self.port),
            ("the proxy's API (ConfigurableHTTPProxy.api_url)", api.hostname or "127.0.0.1",
             api.port or 8001),
            ("the hub API (JupyterHub.hub_port, hub_ip)",
             hub_url.hostname if hub_url else (self.hub_ip or "0.0.0.0"),
             hub_url.port if hub_url else self.hub_port),
            ("the gpulease service (GPULeaseHub.service_address)",
             s.service_listen or "0.0.0.0", s.service_port),
        ]
        if s.culler is not None:
            wanted.append(("the idle culler", "127.0.0.1", int(s.culler["port"])))
        ours = not self.proxy.should_start or previous_proxy_runs(str(s.state.proxy_pid_file))
        taken = taken_ports(wanted[2:] if ours else wanted)
        if taken:
            print("gpulease: cannot start: " + "; ".join(taken) + ". Nothing was started "
                  "and no secret was sent; stop what holds the port or choose another.",
                  file=sys.stderr, flush=True)
            self._undo_prepare()
            self.exit(1)

    def _undo_prepare(self) -> None:
        """What _prepare set up on the host and in the database, undone (a refused start)."""
        if not self._sandbox.kept:  # servers a crashed hub left keep their network
            sandbox_setup.teardown(self._sandbox)
        if getattr(self, "_ctx", None) and self._ctx.meter is not None:
            self._ctx.meter.release_lease()

    def _make_namespaces_ahead(self) -> None:
        """The first starts take network namespaces made ahead (spawners/local/sandbox.py)."""
        if self._sandbox.net is not None:
            pool_for(self._sandbox.net.tag, self._sandbox.net.subnet).fill_in_background()

    def _remove_sandbox_network(self) -> None:
        """The hub stops with its servers (the embedded box): its bridge and rules go."""
        if getattr(self, "_sandbox", None) is not None and self.cleanup_servers:
            sandbox_setup.teardown(self._sandbox)
