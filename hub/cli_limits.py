"""`gpulease limits set|list`: per-user and per-group GPU limits, through the service's API."""

from __future__ import annotations

import argparse
import sys

from gpulease.hub.client import HubClient


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


def _show(limit: dict) -> str:
    def one(value):
        return "no limit" if value is None else str(value)

    return (f"{limit['subject']}: max_gpus {one(limit['max_gpus'])}, "
            f"max_slices {one(limit['max_slices'])}")


def cmd_limits(client: HubClient, args) -> int:
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
