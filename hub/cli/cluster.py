"""`gpulease cluster scheduler-config`: the packing scheduler's configuration (cluster shape).

It is generated from the profiles — the hub's (through api/profiles, as
`profiles export` reads them) or a profiles file — because kube-scheduler
scores only the extended resources it is told by exact name: a MIG profile
added to the hub needs the next configuration (spawners/kube/scheduler_config.py).
"""

from __future__ import annotations

import argparse
import sys

import yaml

from gpulease.core.model.catalog import CatalogError, load_catalog
from gpulease.core.model.profiles import ProfileError, load_profiles_file
from gpulease.hub.cli.client import HubClient
from gpulease.images import CATALOG_PATH
from gpulease.spawners.kube.pod_spec import MIG_STRATEGIES
from gpulease.spawners.kube.scheduler_config import (
    DEFAULT_SCHEDULER_NAME,
    SchedulerSettings,
    profiles_mig,
    scheduler_configuration,
)


def add_cluster_parsers(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="what the cluster shape deploys beside the hub")
    cluster_sub = cluster.add_subparsers(dest="action", required=True)
    config = cluster_sub.add_parser(
        "scheduler-config",
        help="print the KubeSchedulerConfiguration of gpulease's GPU-packing scheduler, for the "
        "hub's profiles (or --profiles FILE); generate it again when MIG profiles change")
    config.add_argument("--profiles", metavar="FILE",
                        help="a profiles file (as `profiles export` writes it) instead of the "
                        "hub's profiles; no hub is needed then")
    config.add_argument("--catalog", metavar="FILE",
                        help="the image catalog the profiles file's images are checked against "
                        "(default: the one shipped with gpulease)")
    config.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME,
                        help="the scheduler's name, which the servers' pods carry as "
                        "schedulerName (set GPUKubeSpawner.packing_scheduler to it; "
                        "default: %(default)s)")
    config.add_argument("--mig-strategy", default="mixed", choices=MIG_STRATEGIES,
                        help="the NVIDIA device plugin's MIG strategy (default: %(default)s)")
    config.add_argument("--lease-namespace", default="kube-system",
                        help="namespace of the leader-election Lease (default: %(default)s)")
    config.add_argument("--kubeconfig", default="",
                        help="a kubeconfig for a scheduler run outside the cluster (default: "
                        "in-cluster credentials)")
    config.add_argument("--no-leader-elect", action="store_true",
                        help="run without leader election (a single scheduler run by hand)")


def needs_hub(args: argparse.Namespace) -> bool:
    return not (args.command == "cluster" and args.profiles)


def _profile_specs(client: HubClient | None, args) -> list[dict] | None:
    if client is not None:
        profiles = client.call("GET", "api/profiles")["profiles"]
        # Only an admin sees every profile (with `enabled`); a researcher's token would
        # leave out the profiles of other groups, and their MIG resources with them.
        # None at all cannot tell the two apart, and configures nothing of use either.
        if not profiles or not all("enabled" in p for p in profiles):
            seen = "no profiles" if not profiles else "only the profiles this token's user may use"
            print(f"gpulease: the hub showed {seen}; the scheduler's configuration needs all of "
                  "them: use an admin's token (the embedded hub's CLI token is one) or "
                  "--profiles FILE", file=sys.stderr)
            return None
        return profiles
    try:
        catalog = load_catalog(args.catalog or CATALOG_PATH)
        return [p.to_spec() for p in load_profiles_file(args.profiles, catalog)]
    except OSError as e:
        print(f"gpulease: cannot read {e.filename or args.profiles}: {e.strerror}",
              file=sys.stderr)
    except CatalogError as e:
        print(f"gpulease: the catalog {args.catalog}: {e}", file=sys.stderr)
    except ProfileError as e:
        problems = "\n".join(f"  {error.field}: {error.message}" for error in e.errors)
        print(f"gpulease: {args.profiles} is not a valid profiles file:\n{problems}",
              file=sys.stderr)
    return None


def cmd_cluster(client: HubClient | None, args) -> int:
    specs = _profile_specs(client, args)
    if specs is None:
        return 2
    try:
        settings = SchedulerSettings(
            scheduler_name=args.scheduler_name, mig_strategy=args.mig_strategy,
            leader_elect=not args.no_leader_elect, lease_namespace=args.lease_namespace,
            kubeconfig=args.kubeconfig)
    except ValueError as e:
        print(f"gpulease: {e}", file=sys.stderr)
        return 2
    config = scheduler_configuration(profiles_mig(specs), settings)
    print(yaml.safe_dump(config, sort_keys=False), end="")
    return 0


CLUSTER_COMMANDS = {"cluster": cmd_cluster}
