"""The options of `gpulease up` (GPULeaseHub), beside JupyterHub's own.

Kept apart from the application's behaviour (gpulease.hub.app) so that each
stays readable; every option has a help text, a default, and a row in
docs/config.md (tests/checks/test_docs.py checks).
"""

from __future__ import annotations

from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from gpulease.core.capacity.queue import QUEUE_PLACES_PER_USER
from gpulease.core.policy.cpu_totals import CPU_ONLY_CPU_PER_USER, CPU_ONLY_MEMORY_PER_USER
from gpulease.core.server_log import DEFAULT_KEEP as DEFAULT_SERVER_LOG_KEEP
from gpulease.core.server_log import DEFAULT_MAX_BYTES as DEFAULT_SERVER_LOG_MAX_BYTES
from gpulease.core.server_log import rotation_problem
from gpulease.core.units import parse_duration
from gpulease.host.state import StateDir, hub_id
from gpulease.host.unix_accounts import UnixAccountPolicy
from gpulease.hub.servers.notifier import WebhookURL
from gpulease.spawners.queueing.spot_preemption import SPOT_GRACE_S
from gpulease.spawners.start.cap_traits import CoresCap, MemoryCap
from gpulease.store.failed_starts import DEFAULT_LIMIT as DEFAULT_FAILED_START_LIMIT

SHAPES = ("embedded", "cluster")


class GPULeaseOptions(Configurable):
    shape = Enum(
        list(SHAPES), "embedded",
        config=True,
        help="Where servers run: embedded (local processes on this GPU box, LocalGPUSpawner) "
        "or cluster (one Kubernetes pod per server, GPUKubeSpawner; needs gpulease[cluster]). "
        "Kubernetes details (storage_class, node_selector, image pull...) are GPUKubeSpawner's "
        "options, set in your config file.",
    )
    cluster_namespace = Unicode(
        "",
        config=True,
        help="cluster shape: the Kubernetes namespace of the servers' pods and home claims. "
        "Empty: the namespace the hub's pod runs in (its ServiceAccount's), else 'default'.",
    )
    state_dir = Unicode(
        config=True,
        help="The state folder: private/ (databases, secrets), homes/ and, when needed, "
        "server-env/. Default: $GPULEASE_STATE, else ./.gpulease; as root with per-user "
        "accounts, when they cannot pass into the current folder (a clone under /root), "
        "/var/lib/gpulease/<folder name>-<hash of its path> instead, one per clone.",
    )
    profiles_file = Unicode(
        config=True,
        help="Profiles file (YAML) applied at start when its content changed since last applied. "
        "Default: the sample profiles shipped with gpulease.",
    )
    inventory_file = Unicode(
        "",
        config=True,
        help="Declared inventory file (YAML) for hosts without a GPU, demos and tests. "
        "Empty: NVML on this host, else the shipped demo inventory.",
    )
    catalog_file = Unicode(
        "", config=True, help="Image catalog (YAML). Empty: the catalog shipped with gpulease."
    )
    admin_name = Unicode(
        "admin",
        config=True,
        help="Name of the first-run admin account. Its password is $GPULEASE_ADMIN_PASSWORD "
        "when set, else generated and printed once.",
    )
    billing_db_url = Unicode(
        "",
        config=True,
        help="gpulease's own database (profiles, assignments, accounts, ledger). "
        "Empty: SQLite in the state folder's private/.",
    )
    node_name = Unicode(
        config=True, help="Name of this host in the inventory. Default: the host name."
    )
    service_address = Unicode(
        "",
        config=True,
        help="host:port where the proxy and the servers reach the gpulease service (servers "
        "get it as GPULEASE_SERVICE_URL: the service's own address, not through the proxy, "
        "which routes the service by its subdomain). Empty: a free port on 127.0.0.1, for a "
        "proxy and servers on this host (the embedded box). In the cluster shape: a name the "
        "proxy's and the servers' pods resolve and a fixed port, e.g. the Helm chart's "
        "<release>-hub.<namespace>.svc:8090; the service then listens on every address of "
        "the hub's pod, at that port.",
    )
    allow_shared_origin = Bool(
        False,
        config=True,
        help="Serve every user's servers on the hub's own origin (/user/NAME/) although "
        "the hub is reachable beyond this machine and no subdomain host is set. A page one "
        "user's server serves can then act as anyone who opens it, an admin included: only "
        "for a hub whose users all trust each other. Without it such a hub refuses to start "
        "and asks for --subdomain-host (JupyterHub.subdomain_host; docs/admin.md).",
    )
    admin_groups = List(
        Unicode(), config=True, help="Hub groups whose members administer gpulease."
    )
    auditor_groups = List(
        Unicode(), config=True, help="Hub groups whose members may read gpulease's records."
    )
    config_file = Unicode(
        "",
        config=True,
        help="A JupyterHub config file laid over gpulease's defaults (its settings win).",
    )
    audit_retention = Unicode(
        "180d",
        config=True,
        help="How long the audit log keeps admin changes: days like 180d, or 90s, 30m, 2h; "
        "0 keeps them forever. Older entries are pruned at start and once a day.",
    )
    queue_max_wait = Unicode(
        "30m",
        config=True,
        help="How long a GPU start waits in the queue for a free device (90s, 30m, 2h); past "
        "it the start fails (503). 0: no queue, refuse at once naming what is free.",
    )
    queue_max_length = Integer(
        500,
        config=True,
        help="Most GPU starts waiting in the queue at once; beyond, a start is refused (503). "
        "JupyterHub's concurrent_spawn_limit is set above it, so a long queue is no 429.",
    )

    spot_grace_period = Float(
        SPOT_GRACE_S,
        config=True,
        help="Seconds a spot server gets to save its work once an on-demand start preempts "
        "it (it is told at once); it is then suspended with reason preempted, billed up to "
        "then. An on-demand server displaced from reserved capacity by a holder's start "
        "(docs/admin.md, reservations) gets as long.",
    )

    reservations_by_researchers = Bool(
        False,
        config=True,
        help="Let researchers reserve (and cancel) for their own account user:NAME through "
        "api/reservations; off, only gpulease admins make reservations, for any account.",
    )
    reservation_lead_time = Unicode(
        "24h",
        config=True,
        help="A reservation whose period begins sooner than this after it is made must fit "
        "beside the servers running when it is made (409 otherwise); only one made further "
        "ahead may have on-demand servers still on its capacity make way for a holder's "
        "start (90m, 24h, 7d; 0: every reservation may). Keeps anyone from stopping "
        "others' servers by reserving the next hour.",
    )
    reservation_end_notice = Unicode(
        "10m",
        config=True,
        help="How long before a reservation ends its running servers are told (90s, 10m, "
        "1h); at its end they continue on demand, or are suspended where the reservation "
        "says so (on_end). 0: told at the end only.",
    )

    # --- per-user limits (docs/admin.md, "Per-user limits"); each refused with 409 naming it
    queue_places_per_user = Integer(
        QUEUE_PLACES_PER_USER,
        config=True,
        help="Most places one user holds in the queue at once (GPU starts waiting for a "
        "device); one more start that would wait is refused (409). 0: no limit.",
    )
    extra_tiers = List(
        Dict(),
        config=True,
        help="Tiers beyond on-demand, spot and reserved, one mapping each: name (1-16 of "
        "a-z, 0-9 and '-'), price_field (the profiles' key of its price, like "
        "preview_price_per_hour), label (what people read), queue_rank (higher is served "
        "first; on-demand is 20, spot 10), and optionally preemptible (false; a "
        "preemptible tier ranks below on-demand), priority_class (its pods' PriorityClass "
        "as GPUKubeSpawner.tier_priority_classes maps it; null: the cluster's default), "
        "requestable (true) and metered (true). The hub and the gpulease service register "
        "them alike (docs/architecture.md, \"A tier\").",
    )
    failed_start_limit = Integer(
        DEFAULT_FAILED_START_LIMIT,
        config=True,
        help="Failed starts (the server's own code exited before it answered, or did not "
        "answer within the spawner's http_timeout and was killed) of one user on one "
        "profile within failed_start_window after which further starts of that profile "
        "are refused (429 with Retry-After) until the oldest leaves the window. Each was "
        "billed for what it ran. 0: never refused. `gpulease limits clear-failed-starts` "
        "forgives a user.",
    )
    failed_start_window = Unicode(
        "10m",
        config=True,
        help="The window over which failed starts count for failed_start_limit (90s, 10m, "
        "1h).",
    )
    cpu_only_cpu_per_user = CoresCap(
        CPU_ONLY_CPU_PER_USER,
        config=True,
        help="Cores (the profiles' cpu) all of one user's running and starting CPU-only "
        "servers may have together; a start beyond is refused (409). 0: no limit.",
    )
    cpu_only_memory_per_user = MemoryCap(
        CPU_ONLY_MEMORY_PER_USER,
        config=True,
        help="Memory (the profiles' memory, e.g. 64Gi) all of one user's running and starting "
        "CPU-only servers may have together; a start beyond is refused (409). 0: no limit.",
    )

    @validate("spot_grace_period")
    def _valid_spot_grace_period(self, proposal):
        if not 0 <= proposal["value"] <= 86400:
            raise TraitError(f"spot_grace_period must be 0 to 86400 seconds, not "
                             f"{proposal['value']}")
        return proposal["value"]

    @validate("queue_places_per_user")
    def _valid_queue_places_per_user(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"queue_places_per_user must be 0 (no limit) or more, not "
                             f"{proposal['value']}")
        return proposal["value"]

    @validate("reservation_end_notice")
    def _valid_reservation_end_notice(self, proposal):
        try:
            parse_duration(proposal["value"], "reservation_end_notice")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("failed_start_limit")
    def _valid_failed_start_limit(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"failed_start_limit must be 0 (never refuse) or more, not "
                             f"{proposal['value']}")
        return proposal["value"]

    @validate("failed_start_window")
    def _valid_failed_start_window(self, proposal):
        try:
            parse_duration(proposal["value"], "failed_start_window")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("queue_max_wait")
    def _valid_queue_max_wait(self, proposal):
        try:
            parse_duration(proposal["value"], "queue_max_wait")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    heartbeat_interval = Float(
        15.0,
        config=True,
        help="Seconds between billing heartbeats: running sessions are confirmed, accounts "
        "at zero stopped. A hub crash loses or over-bills at most one interval.",
    )

    # --- notifications: the SMTP password is $GPULEASE_SMTP_PASSWORD only, never a trait
    notify_webhook_url = WebhookURL("", config=True, help="Incoming-webhook URL (Slack or "
                                    "Teams) for users who choose 'webhook'. Empty: none.")
    smtp_host = Unicode("", config=True, help="SMTP relay for email notices. Empty: no email.")
    smtp_port = Integer(25, config=True, help="Port of the SMTP relay (465: implicit TLS).")
    smtp_from = Unicode("gpulease@localhost", config=True, help="Sender of notice mails.")
    smtp_starttls = Bool(False, config=True, help="Use STARTTLS on the SMTP connection.")
    smtp_username = Unicode("", config=True, help="SMTP login name; empty: no login.")


    # --- the idle culler
    culler_enabled = Bool(
        True, config=True,
        help="Run gpulease's idle culler: suspend servers idle for their profile's idle_timeout.",
    )
    culler_interval = Float(
        30.0, config=True, help="Seconds between the idle culler's passes over all servers."
    )
    culler_cpu_threshold = Float(
        10.0, config=True,
        help="CPU use (percent of one core) above which a server counts as active.",
    )
    culler_gpu_threshold = Float(
        5.0, config=True,
        help="GPU compute utilisation (percent) above which a server counts as active.",
    )
    culler_gpu_source = Unicode(
        "", config=True,
        help="Where the culler reads GPU activity: nvml, prometheus:URL (DCGM exporter) or "
        "none. Empty: prometheus:culler_prometheus_url when that is set, else nvml when the "
        "inventory comes from NVML, else none.",
    )
    culler_prometheus_url = Unicode(
        "", config=True,
        help="Base URL of the Prometheus HTTP API that scrapes dcgm-exporter (e.g. "
        "http://prometheus.monitoring:9090): the culler's GPU signal, "
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE; in the cluster shape a pod's series are found by "
        "their pod and namespace labels. Empty: no Prometheus (in the cluster shape the GPU "
        "signal is then unknown).",
    )
    culler_warn_before = Unicode(
        "5m", config=True,
        help="How long before suspending the user is warned (at most half the idle timeout).",
    )
    culler_stale_after = Unicode(
        "3m", config=True,
        help="How long a server's pushed kernel and terminal state counts as current for the "
        "culler (a duration: 90s, 3m); keep it a few of the servers' "
        "ActivityPusher.interval (60 s). Older pushes keep a server only until they were made.",
    )

    culler_readings_interval = Float(
        10.0, config=True,
        help="Seconds between the idle culler's GPU readings (each running GPU server's "
        "activity and memory in use), sent to the gpulease service for its researcher's "
        "status and their session's mean and peak: 1 to 300, or 0 to turn them off (GPU "
        "stats then read 'no reading'). Never part of an idle decision.",
    )

    gpu_chart_step = Integer(
        60, config=True,
        help="Seconds per point of the last-hour GPU chart in researchers' JupyterLab status "
        "panel (1 to 600): each point is the step's mean activity and peak memory. The "
        "gpulease service holds 3600/step points per running GPU server in memory, about "
        "18 bytes each, beside its latest reading (60: some 3 KB a server).",
    )

    @validate("gpu_chart_step")
    def _valid_gpu_chart_step(self, proposal):
        if not 1 <= proposal["value"] <= 600:
            raise TraitError(f"gpu_chart_step must be 1 to 600 seconds, not {proposal['value']}")
        return proposal["value"]

    @validate("culler_readings_interval")
    def _valid_culler_readings_interval(self, proposal):
        # The culler takes any negative as off; on the hub it is a typo, said at start. The
        # service takes readings 1 to 300 s apart (each stands for that much of a session).
        value = proposal["value"]
        if value != 0 and not 1 <= value <= 300:
            raise TraitError(f"culler_readings_interval must be 0 (off) or 1 to 300 seconds, "
                             f"not {value}")
        return value

    @validate("culler_stale_after")
    def _valid_culler_stale_after(self, proposal):
        try:
            if parse_duration(proposal["value"], "culler_stale_after") <= 0:
                raise ValueError("culler_stale_after must be longer than 0 (e.g. 3m)")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    # --- isolation between users (docs/security.md)
    per_user_accounts = Bool(
        True, config=True,
        help="When the hub runs as root, run each user's servers as their own Unix account "
        "(created on first start or by `gpulease users add`). False: every server runs as the "
        "hub's account, a trusted-group setup with no isolation between users.",
    )
    server_env = Unicode(
        "", config=True,
        help="The Python environment servers run from (its bin/gpulease-singleuser) when "
        "their image names no local_env: a prefix with gpulease installed. Empty: gpulease's "
        "own; as root "
        "with per-user accounts that cannot reach it (a clone under /root), a copy of it that "
        "`gpulease up` refreshes at each start in the state folder's server-env/.",
    )
    unix_account_prefix = Unicode(
        "gl-", config=True,
        help="Prefix of per-user Unix account names (gl-ada for hub user ada); names that are "
        "too long or unsafe are cut and given a hash.",
    )
    unix_uid_min = Integer(61000, config=True, help="Lowest uid of a per-user Unix account.")
    unix_uid_max = Integer(64999, config=True, help="Highest uid of a per-user Unix account.")
    adopt_unmarked_accounts = Bool(
        False, config=True,
        help="Use a per-user Unix account that gpulease made for that hub user but that "
        "records no hub (made before hub ids: its comment is 'gpulease user NAME'), and "
        "record this hub's id in it (logged). Only when no other hub on this host uses the "
        "same prefix: its accounts would become this hub's. An account recording another "
        "hub's id is always refused.",
    )

    def unix_policy(self, state: StateDir) -> UnixAccountPolicy:
        """The per-user accounts' names and uids, and this hub's id they record."""
        return UnixAccountPolicy(self.unix_account_prefix, self.unix_uid_min, self.unix_uid_max,
                                 hub_id=hub_id(state),
                                 adopt_unmarked=self.adopt_unmarked_accounts)

    warm_start = Bool(
        True, config=True,
        help="Fork each server from a launcher process that has already imported the "
        "notebook server, and start a kernel with each server: a first cell about 1.5 s "
        "sooner (docs/admin.md, 'Warm starts'). The launcher is a new program started "
        "with a clean environment, never a fork of the hub. False: every server starts as "
        "a new program; the hub says at start which it does. Not used with "
        "resource_limits = systemd, nor for images whose server is not a Python script.",
    )
    resource_limits = Unicode(
        "auto", config=True,
        help="How profiles' CPU and memory limits (and GPU device nodes) are enforced: auto "
        "(systemd when it is the init system, else a writable cgroup v2, else cgroup v1), "
        "systemd, cgroup2, cgroup1, or none. Needs root; the hub says at start what it uses.",
    )
    device_nodes = Dict(
        config=True,
        help="Device UUID -> list of device node paths a server holding it may open, for "
        "declared inventories (their UUIDs have no nodes) and tests. NVML hosts map their "
        "GPUs and MIG devices themselves.",
    )

    # --- each server's sandbox on the embedded box (docs/security.md, "The sandbox")
    server_sandbox = Enum(
        ["auto", "on", "off"], "auto", config=True,
        help="Run each server in a sandbox of its own: a network namespace reachable from "
        "the hub and the proxy on its HTTP port only, its own IPC namespace, /dev/shm and "
        "/tmp, and a /proc that hides other accounts' processes. auto: where the host can "
        "(root, per-user accounts, nftables); on: refuse to start where it cannot; off: "
        "servers share the host's network, /dev/shm, /tmp and process list (the hub says "
        "so at start).",
    )
    server_egress = Enum(
        ["internet", "none"], "internet", config=True,
        help="What a sandboxed server may reach beyond the hub API and the gpulease service: "
        "internet (other networks through NAT: turns on IPv4 forwarding host-wide, guarded "
        "so that the host forwards nothing else; never the host's own ports, another "
        "server, or 169.254.0.0/16 with the cloud metadata address), or none.",
    )
    server_egress_blocked = List(
        Unicode(), config=True,
        help="IPv4 addresses or networks a sandboxed server may never reach, beyond the "
        "host's own ports, other servers and 169.254.0.0/16: a lab's internal ranges, "
        "e.g. ['10.0.0.0/8'].",
    )
    sandbox_resolv_conf = Unicode(
        "", config=True,
        help="The resolver file (resolv.conf) whose nameservers sandboxed servers use: a "
        "lab's own DNS. Empty: the host's /etc/resolv.conf, or systemd-resolved's upstream "
        "list when that names a resolver on the host's loopback (127.0.0.53), which a "
        "server's namespace cannot reach.",
    )
    sandbox_network = Unicode(
        "10.213.0.0/16", config=True,
        help="The private IPv4 range the servers' namespaces take their addresses from: "
        "each hub on the host takes a free /24 of it (up to 250 servers), the .1 of "
        "which is the host's, where servers reach the hub API and the gpulease service.",
    )

    # --- each server's own log on the embedded box (docs/admin.md, "Servers' logs")
    server_log_max_bytes = Integer(
        DEFAULT_SERVER_LOG_MAX_BYTES, config=True,
        help="embedded shape: the bytes a server's log file (its stdout and stderr, in "
        "<state>/logs/servers/<user>/<server>.log) grows to before it is rotated: renamed "
        ".1 and a new one begun. 64 KiB to 1 GiB. Each start of a server begins a new file "
        "too. (cluster shape: the logs are Kubernetes', kubectl logs.)",
    )
    server_log_keep = Integer(
        DEFAULT_SERVER_LOG_KEEP, config=True,
        help="embedded shape: rotated log files kept per server (the older are removed): a "
        "server's log takes at most (server_log_keep + 1) * server_log_max_bytes. 0 to 100.",
    )

    @validate("server_log_max_bytes", "server_log_keep")
    def _valid_server_log(self, proposal):
        values = {"server_log_max_bytes": self.server_log_max_bytes,
                  "server_log_keep": self.server_log_keep,
                  proposal["trait"].name: proposal["value"]}
        problem = rotation_problem(values["server_log_max_bytes"], values["server_log_keep"])
        if problem:
            raise TraitError(problem)
        return proposal["value"]

    def _server_log_settings(self) -> dict[str, int]:
        """LocalGPUSpawner's options of the same names (hub_config sets them)."""
        return {"server_log_max_bytes": self.server_log_max_bytes,
                "server_log_keep": self.server_log_keep}
