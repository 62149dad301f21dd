"""The `gpulease` command's parser and dispatch: `up` runs the embedded hub; the rest talk to a
hub's REST API."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Sequence

import yaml

from gpulease import skip_rfc3987_grammar
from gpulease.core.policy.user_names import name_problem
from gpulease.core.tiers import is_preemptible
from gpulease.core.units import load_yaml_file
from gpulease.hub.cli.billing import BILLING_COMMANDS, add_billing_parsers
from gpulease.hub.cli.client import ClientError, HubClient, client_from
from gpulease.hub.cli.cluster import CLUSTER_COMMANDS, add_cluster_parsers, needs_hub
from gpulease.hub.cli.limits import LIMITS_COMMANDS, add_limits_parsers
from gpulease.hub.cli.logs import LOGS_COMMANDS, add_logs_parsers
from gpulease.hub.cli.reservations import RESERVATIONS_COMMANDS, add_reservations_parsers
from gpulease.process_exit import end_process


def _yaml_safe(value):
    """Decimals (exact prices) as strings, so the YAML printed is plain and exact."""
    if isinstance(value, dict):
        return {k: _yaml_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_yaml_safe(v) for v in value]
    if hasattr(value, "as_tuple"):  # decimal.Decimal
        return str(value)
    return value


def cmd_inventory(client: HubClient, args) -> int:
    if getattr(args, "action", None) == "return":
        return _return_device(client, args)
    data = client.call("GET", "api/inventory")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if data.get("shape") == "cluster":
        _print_cluster_inventory(data)
        return 0
    print(f"Inventory: {data['label']}")
    for node in data["nodes"]:
        print(f"node {node['name']}")
        for gpu in node["gpus"]:
            mode = "MIG" if gpu["mig"] else "full card"
            print(f"  GPU {gpu['index']} {gpu['model']} ({mode}) {gpu['uuid']}")
            for dev in gpu["devices"]:
                what = dev["profile"] or "whole GPU"
                who = f"held by {_holder(dev['holder'])}" if dev["holder"] else "free"
                if dev["state"] == "out_of_service":
                    who = (f"OUT OF SERVICE: processes of {_holder(dev['holder'])} are still in "
                           f"its cgroup (`gpulease inventory return {dev['uuid']}`)")
                print(f"    {what:<12} {dev['uuid']}  {who}")
    for dev in data.get("gone", []):
        print(f"  GONE {dev['uuid']} still recorded for {_holder(dev['holder'])}")
    for q in data.get("queue", []):
        print(f"queued {q['position']}: {_holder(q)} waits for {q['profile']}")
    isolation = data.get("isolation") or {}
    for key in ("accounts_summary", "limits_summary"):
        if isolation.get(key):
            print(isolation[key])
    return 0


def _return_device(client: HubClient, args) -> int:
    """`inventory return UUID [--force]`: an out-of-service device back to the pool."""
    result = client.call("POST", f"api/inventory/{args.uuid}/return", {"force": args.force})
    forced = f" (forced; pids still there: {result['pids_left']})" if result["forced"] else ""
    print(f"device {result['uuid']} is back in service{forced}")
    return 0


def _print_cluster_inventory(data: dict) -> None:
    """api/inventory's cluster form: per node and resource, counts and holders."""
    print(f"Inventory: the Kubernetes cluster (servers in namespace {data['namespace']}), "
          f"listed at {data['listed_at']}")
    for node in data["nodes"]:
        state = "" if node["schedulable"] else " NOT SCHEDULABLE (cordoned or not Ready)"
        print(f"node {node['name']} {node['model'] or '(no GPU model)'}, MIG strategy "
              f"{node['mig_strategy']}{state}")
        for r in node["resources"]:
            holders = ", ".join(f"{_holder(h) if 'user' in h else h['pod']} x{h['count']}"
                                for h in r["holders"]) or "none"
            print(f"  {r['resource']:<28} {r['free']}/{r['allocatable']} free  held by {holders}")
        for d in node.get("devices") or []:  # DRA mode: each device and its holder
            h = d["holder"]
            who = "free" if h is None else _holder(h) if "user" in h else h["pod"]
            what = f"MIG {d['profile']}" if d["type"] == "mig" else "full card"
            print(f"    {d['uuid']:<44} {what:<16} {who}")
        for gpu in node.get("gpus") or []:  # DynamicMIG: per GPU, the slices carved now
            carved = "; ".join(_carved_text(c) for c in gpu["carved"])
            print(f"    {gpu['gpu']}: {carved or 'nothing carved'}")
    for line in cluster_summary(data["nodes"]):
        print(line)
    for q in data.get("queue", []):
        print(f"queued {q['position']}: {_holder(q)} waits for {q['profile']}")


def _carved_text(carved: dict) -> str:
    """One slice carved on a DynamicMIG GPU: `3g.71gb at memory slice 4 (ada)`."""
    h = carved["holder"] or {}
    who = _holder(h) if h.get("user") else h.get("pod", "free")
    if not carved["profile"]:
        return f"whole GPU ({who})"
    return f"{carved['profile']} at memory slice {carved['first_memory_slice'] or 0} ({who})"


def cluster_summary(nodes: list[dict]) -> list[str]:
    """Per model and resource, over schedulable nodes: free, whole nodes free, the largest fit.

    What an operator reads to see fragmentation (docs/cluster.md, the packing
    scheduler): GPUs free in ones and twos across many nodes start no 8-GPU
    request; nodes left wholly free do."""
    totals: dict[tuple[str, str], list[int]] = {}
    for node in nodes:
        if not node["schedulable"]:
            continue
        for r in node["resources"]:
            if not r["allocatable"]:
                continue
            t = totals.setdefault((node["model"] or "(no model)", r["resource"]), [0, 0, 0, 0, 0])
            t[0] += r["free"]
            t[1] += r["allocatable"]
            t[2] += 1
            t[3] += r["free"] == r["allocatable"]
            t[4] = max(t[4], r["free"])
    return [f"{model} {resource}: {free}/{alloc} free on {count} node{'s' * (count != 1)}; "
            f"{whole} wholly free; the most one start can get now: {largest}"
            for (model, resource), (free, alloc, count, whole, largest) in sorted(totals.items())]


def _holder(holder: dict) -> str:
    spot = f" ({holder['tier']})" if is_preemptible(holder.get("tier", "")) else ""
    return f"{holder['user']}/{holder['server'] or '(default)'}{spot}"


def _describe_gpu(gpu: dict | None) -> str:
    if not gpu:
        return "CPU only"
    if gpu.get("mig"):
        return f"{gpu['model']} {gpu['mig']}"
    return f"{gpu.get('count', 1)}× {gpu['model']}"


def cmd_profiles(client: HubClient, args) -> int:
    if args.action == "list":
        for p in client.call("GET", "api/profiles")["profiles"]:
            what = _describe_gpu(p.get("gpu"))
            avail = p["availability"]
            free = "" if avail["free"] is None else f"{avail['free']}/{avail['total']} free"
            state = "" if p.get("enabled", True) else " (disabled)"
            print(f"{p['slug']:<20} {what:<22} {p['price_per_hour']:>10} cr/h  {free}{state}")
        return 0
    if args.action == "export":
        profiles = client.call("GET", "api/profiles")["profiles"]
        for p in profiles:
            p.pop("availability", None)
        print(yaml.safe_dump({"profiles": profiles}, sort_keys=False), end="")
        return 0
    # apply
    try:
        document = load_yaml_file(args.file)
    except (OSError, yaml.YAMLError) as e:
        print(f"gpulease: cannot read {args.file}: {e}", file=sys.stderr)
        return 2
    if not isinstance(document, dict) or "profiles" not in document:
        print(f"gpulease: {args.file}: expected a mapping with a 'profiles' list", file=sys.stderr)
        return 2
    result = client.call(
        "PUT", "api/profiles", {"profiles": _yaml_safe(document["profiles"]), "prune": args.prune}
    )
    for key in ("created", "updated", "unchanged", "deleted"):
        if result[key]:
            print(f"{key}: {', '.join(result[key])}")
    return 0


def cmd_users(client: HubClient, args) -> int:
    problem = name_problem(args.name)
    if problem:  # before asking for a password; the service refuses the same (one rule)
        print(f"gpulease: {problem}", file=sys.stderr)
        return 2
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"Password for {args.name}: ")
        if password != getpass.getpass("Again: "):
            print("gpulease: the passwords differ", file=sys.stderr)
            return 2
    result = client.call(
        "POST", "api/users", {"name": args.name, "password": password, "admin": args.admin}
    )
    print(f"created user {result['name']}" + (" (admin)" if result["admin"] else ""))
    if result.get("unix_account"):
        print(f"Unix account {result['unix_account']} (uid {result['uid']})")
    if result.get("unix_account_error"):
        print(f"gpulease: warning: no Unix account yet ({result['unix_account_error']}); "
              "the first start tries again", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpulease", description="GPU notebooks on JupyterHub")
    parser.add_argument("--url", help="hub URL (default: $GPULEASE_URL, else the embedded hub)")
    parser.add_argument(
        "--token", help="API token (default: $GPULEASE_TOKEN, else the embedded hub's)"
    )
    parser.add_argument("--state", help="state folder of the embedded hub (default: "
                        "$GPULEASE_STATE, else the one `gpulease up` run here uses)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="run the embedded hub (see `gpulease up --help-all`)", add_help=False)
    inv = sub.add_parser("inventory", help="GPUs and MIG devices, what is free, who holds what")
    inv.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    inv_sub = inv.add_subparsers(dest="action")
    ret = inv_sub.add_parser(
        "return", help="return an out-of-service device to the pool (admins; refused while "
        "processes of its last server remain, unless --force)")
    ret.add_argument("uuid", help="the device's UUID, as `gpulease inventory` shows it")
    ret.add_argument("--force", action="store_true",
                     help="return it even though processes are still in its cgroup")
    prof = sub.add_parser("profiles", help="list, export or apply profiles")
    prof_sub = prof.add_subparsers(dest="action", required=True)
    prof_sub.add_parser("list", help="every profile, one a line")
    prof_sub.add_parser("export", help="all profiles as a YAML document (for apply)")
    apply = prof_sub.add_parser("apply", help="upsert the profiles of a YAML document")
    apply.add_argument("file", help="a profiles document, as export writes it")
    apply.add_argument("--prune", action="store_true", help="also delete profiles not in the file")
    users = sub.add_parser("users", help="local accounts")
    users_sub = users.add_subparsers(dest="action", required=True)
    add = users_sub.add_parser("add", help="a local account and its hub user")
    add.add_argument("name", help="1 to 32 lowercase letters a-z, digits and '-'; starts with "
                                  "a letter, does not end with '-' (no system account's name)")
    add.add_argument("--admin", action="store_true",
                     help="make a hub admin (needs a hub admin's token; the embedded hub's "
                          "CLI token is one)")
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from stdin's first line (default: ask twice)")
    add_billing_parsers(sub)
    add_limits_parsers(sub)
    add_reservations_parsers(sub)
    add_logs_parsers(sub)
    add_cluster_parsers(sub)
    return parser


COMMANDS = {"inventory": cmd_inventory, "profiles": cmd_profiles, "users": cmd_users,
            **BILLING_COMMANDS, **LIMITS_COMMANDS, **RESERVATIONS_COMMANDS, **LOGS_COMMANDS,
            **CLUSTER_COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "up":
        skip_rfc3987_grammar()  # before JupyterHub is imported
        from gpulease.hub.app import GPULeaseHub

        GPULeaseHub.launch_instance(argv[1:])
        end_process(0)  # stopped and cleaned up: skip Python's finalization
    args = build_parser().parse_args(argv)
    try:
        client = client_from(args.url, args.token, args.state) if needs_hub(args) else None
        return COMMANDS[args.command](client, args)
    except ClientError as e:
        print(f"gpulease: {e}", file=sys.stderr)
        return 1
