"""`gpulease limits set|list`: per-user and per-group GPU limits; `limits failed-starts` and
`limits clear-failed-starts`: the rationing of failed starts. Through the service's API."""

from __future__ import annotations

import argparse
import sys
from urllib.parse import quote

from gpulease.hub.cli.client import HubClient


def _count(text: str) -> int | None:
    """A limit on the command line: a whole number, or `none` to remove it."""
    if text.lower() in ("none", "null", "-"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of devices (0 or more, or 'none')") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; limits are 0 or more")
    return value


def add_limits_parsers(sub: argparse._SubParsersAction) -> None:
    limits = sub.add_parser("limits", help="per-user and per-group limits on GPUs and slices")
    limits_sub = limits.add_subparsers(dest="action", required=True)
    put = limits_sub.add_parser("set", help="set a user's or a group's limits")
    put.add_argument("subject", help="user:NAME or group:NAME (a bare NAME means user:NAME)")
    put.add_argument("--max-gpus", type=_count, default=argparse.SUPPRESS,
                     help="most full GPUs held at once ('none': no limit)")
    put.add_argument("--max-slices", type=_count, default=argparse.SUPPRESS,
                     help="most MIG slices held at once ('none': no limit)")
    limits_sub.add_parser("list", help="every limit set")
    failed = limits_sub.add_parser(
        "failed-starts", help="a user's failed starts still counted, and what they pause")
    failed.add_argument("user", nargs="?", help="the user (default: you)")
    clear = limits_sub.add_parser(
        "clear-failed-starts", help="forgive a user's failed starts: their starts of the "
        "profile are no longer refused (audit log)")
    clear.add_argument("user", help="the user")
    clear.add_argument("--profile", help="only this profile's (default: every profile's)")


def _show(limit: dict) -> str:
    def one(value):
        return "no limit" if value is None else str(value)

    return (f"{limit['subject']}: max_gpus {one(limit['max_gpus'])}, "
            f"max_slices {one(limit['max_slices'])}")


def cmd_limits(client: HubClient, args) -> int:
    if args.action == "failed-starts":
        query = f"?user={quote(args.user)}" if args.user else ""
        data = client.call("GET", f"api/failed-starts{query}")
        for f in data["failed_starts"]:
            print(f"{f['at']} {f['profile']} ({f['server'] or 'default server'}): {f['why']}")
        for p in data["paused"]:
            print(f"starts of {p['profile']} refused until {p['until']}")
        if not data["failed_starts"]:
            print(f"no failed starts of {data['user']} counted (limit {data['limit']} within "
                  f"{data['window_seconds']} s)")
        return 0
    if args.action == "clear-failed-starts":
        query = f"?profile={quote(args.profile)}" if args.profile else ""
        data = client.call("DELETE", f"api/failed-starts/{quote(args.user)}{query}")
        print(f"cleared {data['cleared']} failed start(s) of {data['user']}"
              f"{' on ' + data['profile'] if data['profile'] else ''}")
        return 0
    if args.action == "list":
        data = client.call("GET", "api/limits")
        for limit in data["limits"]:
            print(_show(limit))
        if not data["limits"]:
            print("no limits set")
        return 0
    subject = args.subject if ":" in args.subject else f"user:{args.subject}"
    body = {key: getattr(args, key) for key in ("max_gpus", "max_slices") if hasattr(args, key)}
    if not body:
        print("gpulease: give --max-gpus and/or --max-slices (a number, or 'none')",
              file=sys.stderr)
        return 2
    print(_show(client.call("PUT", f"api/limits/{subject}", body)))
    return 0


LIMITS_COMMANDS = {"limits": cmd_limits}
