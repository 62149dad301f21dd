"""The options of `gpulease up` (GPULeaseHub), beside JupyterHub's own.

Kept apart from the application's behaviour (gpulease.hub.app) so that each
stays readable; every option has a help text, a default, and a row in
docs/config.md (tests/test_docs.py checks).
"""

from __future__ import annotations

from traitlets import Bool, Float, Integer, List, Unicode
from traitlets.config import Configurable

from gpulease.hub.notifier import WebhookURL


class GPULeaseOptions(Configurable):
    state_dir = Unicode(
        config=True,
        help="The state folder: private/ (databases, secrets) and homes/. "
        "Default: $GPULEASE_STATE, else ./.gpulease",
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
        "none. Empty: nvml when the inventory comes from NVML, else none.",
    )
    culler_warn_before = Unicode(
        "5m", config=True,
        help="How long before suspending the user is warned (at most half the idle timeout).",
    )
