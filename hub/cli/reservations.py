"""`gpulease reservations add|list|cancel`, through the service's api/reservations."""

from __future__ import annotations

import argparse

from gpulease.hub.cli.client import HubClient


def add_reservations_parsers(sub: argparse._SubParsersAction) -> None:
    res = sub.add_parser("reservations", help="capacity held for an account over a period, "
                                              "paid once (docs/admin.md, Reservations)")
    res_sub = res.add_subparsers(dest="action", required=True)
    add = res_sub.add_parser("add", help="reserve units of a profile; charged at once")
    add.add_argument("account", help="user:NAME or group:NAME (a bare NAME means user:NAME)")
    add.add_argument("profile", help="a profile with a reserved_price_per_hour")
    add.add_argument("--units", type=int, default=1,
                     help="servers of the profile held at once (default 1)")
    add.add_argument("--start", required=True,
                     help="UTC, on a whole hour: 2026-12-24T09:00:00Z")
    add.add_argument("--end", required=True, help="UTC, on a whole hour, after --start")
    add.add_argument("--on-end", choices=("continue", "suspend"), default="continue",
                     help="its servers at its end: go on on demand (default), or suspended")
    add.add_argument("--note", default="", help="why, for the ledger and the audit log")
    listing = res_sub.add_parser("list", help="reservations now and to come")
    listing.add_argument("--account", help="one account's")
    listing.add_argument("--past", action="store_true", help="ended and cancelled ones too")
    cancel = res_sub.add_parser("cancel", help="cancel one: refunds all before its start, "
                                               "the whole hours not begun after it")
    cancel.add_argument("id", help="the reservation's id, as list shows it")


def _line(r: dict) -> str:
    return (f"#{r['id']} {r['account']}: {r['units']} × {r['profile']} ({r['devices']}), "
            f"{r['start']} to {r['end']} ({r['hours']} h), {r['cost']} credits, "
            f"{r['state']}, on end: {r['on_end']}")


def cmd_reservations(client: HubClient, args) -> int:
    if args.action == "list":
        params = {"past": "true"} if args.past else {}
        if args.account:
            params["account"] = args.account
        data = client.call("GET", "api/reservations", params=params)
        for r in data["reservations"]:
            print(_line(r))
        if not data["reservations"]:
            print("no reservations")
        return 0
    if args.action == "cancel":
        data = client.call("DELETE", f"api/reservations/{args.id}")
        print(_line(data["reservation"]))
        print(f"refunded {data['refund']} credits to {data['reservation']['account']}")
        return 0
    account = args.account if ":" in args.account else f"user:{args.account}"
    body = {"account": account, "profile": args.profile, "units": args.units,
            "start": args.start, "end": args.end, "on_end": args.on_end, "note": args.note}
    print(_line(client.call("POST", "api/reservations", body)))
    return 0


RESERVATIONS_COMMANDS = {"reservations": cmd_reservations}
