"""`gpulease credits grant|adjust` and `gpulease usage`: the billing commands of the CLI."""

from __future__ import annotations

import argparse
import sys

import requests

from gpulease.core.units import seconds_text
from gpulease.hub.cli.client import ClientError, HubClient, describe_error
from gpulease.site_urls import loopback_session


def add_billing_parsers(sub: argparse._SubParsersAction) -> None:
    credits = sub.add_parser("credits", help="grant credits, or adjust a balance with a note")
    credits_sub = credits.add_subparsers(dest="action", required=True)
    grant = credits_sub.add_parser("grant", help="add credits to an account")
    grant.add_argument("account", help="user:NAME or group:NAME (a bare NAME means user:NAME)")
    grant.add_argument("amount", help="credits, exact decimal text, e.g. 12.5")
    grant.add_argument("--note", default="", help="why (kept in the ledger)")
    adjust = credits_sub.add_parser("adjust", help="a signed correction, with a note")
    adjust.add_argument("account", help="user:NAME or group:NAME (a bare NAME means user:NAME)")
    adjust.add_argument("amount", help="signed credits, e.g. -2.5")
    adjust.add_argument("--note", required=True, help="why (required)")
    usage = sub.add_parser("usage", help="sessions, billed seconds and cost (default: the "
                           "current UTC month; a period spans at most 366 days)")
    usage.add_argument("--user", help="whose usage (admins and auditors; default: yours)")
    usage.add_argument("--since", help="YYYY-MM-DD (inclusive) or an ISO 8601 timestamp; "
                       "default: the current UTC month's first day")
    usage.add_argument("--until", help="YYYY-MM-DD (exclusive) or an ISO 8601 timestamp; "
                       "default: the next UTC month's first day")
    usage.add_argument("--csv", action="store_true", help="print CSV instead of a table")


def cmd_credits(client: HubClient, args) -> int:
    path = "api/credits" if args.action == "grant" else "api/adjustments"
    # The amount goes as a JSON string: exact, never through a float.
    entry = client.call("POST", path,
                        {"account": args.account, "amount": args.amount, "note": args.note})
    verb = "granted" if args.action == "grant" else "adjusted"
    print(f"{verb} {entry['amount']} credits on {entry['account']} (entry {entry['id']}); "
          f"balance {entry['balance']}")
    return 0


def cmd_usage(client: HubClient, args) -> int:
    params = {k: v for k, v in (("user", args.user), ("since", args.since),
                                ("until", args.until)) if v}
    if args.csv:
        sys.stdout.write(_get_text(client, "api/usage", {**params, "format": "csv"}))
        return 0
    data = client.call("GET", "api/usage", params=params)
    print(format_usage_table(data))
    return 0


def format_usage_table(data: dict) -> str:
    header = ("user", "server", "profile", "account", "started", "ended", "seconds",
              "cost", "reason")
    rows = [
        (s["user"], s["server"] or "(default)", s["profile"], s["account"], s["started"],
         s["ended"] or "running", seconds_text(s["billed_ms"]), s["cost"], s["end_reason"] or "")
        for s in data["sessions"]
    ]
    totals = data["totals"]
    footer = ("total", "", "", "", "", f"{len(rows)} sessions", seconds_text(totals["billed_ms"]),
              totals["cost"], "")
    widths = [max(len(r[i]) for r in [header, *rows, footer]) for i in range(len(header))]
    right = {6, 7}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows), line(footer)])


def _get_text(client: HubClient, path: str, params: dict) -> str:
    try:
        response = loopback_session().get(client.service_url + path, params=params,
                                          headers={"Authorization": f"token {client.token}"},
                                          timeout=client.timeout, allow_redirects=False)
    except requests.RequestException as e:
        raise ClientError(f"cannot reach the hub at {client.url}: {e}") from None
    if response.status_code >= 300:
        raise ClientError(describe_error(response))
    return response.text


BILLING_COMMANDS = {"credits": cmd_credits, "usage": cmd_usage}
