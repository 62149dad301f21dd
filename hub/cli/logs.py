"""`gpulease logs USER[/SERVER] [--lines N]`: what a server wrote, through the service's api/logs.

The text is the researcher's: the service takes terminal control sequences out
of it (gpulease.core.server_log.shown_text), and so does this command once more
before it prints, so that a hub of another version, or a log read some other
way, cannot drive the admin's terminal either.
"""

from __future__ import annotations

import argparse
import sys
from urllib.parse import quote

from gpulease.core.policy.user_names import name_problem
from gpulease.core.server_log import server_name_problem, shown_text
from gpulease.hub.cli.client import HubClient


def add_logs_parsers(sub: argparse._SubParsersAction) -> None:
    logs = sub.add_parser("logs", help="what a server wrote to its stdout and stderr (admins; "
                                       "docs/admin.md, Servers' logs)")
    logs.add_argument("server", metavar="USER[/SERVER]",
                      help="the user's default server, or USER/SERVER a named one")
    logs.add_argument("--lines", "-n", type=int, default=None,
                      help="only its last N lines (default: all of its last MiB)")


def split_server(text: str) -> tuple[str, str]:
    """USER[/SERVER] -> (user, server); ValueError naming the rule broken."""
    user, _, server = text.partition("/")
    problem = name_problem(user) or server_name_problem(server)
    if problem or (text.endswith("/") and not server):
        raise ValueError(problem or "USER/ needs a server name after the '/' (or no '/' for "
                         "the default server)")
    return user, server


def cmd_logs(client: HubClient, args) -> int:
    try:
        user, server = split_server(args.server)
    except ValueError as e:
        print(f"gpulease: {e}", file=sys.stderr)
        return 2
    if args.lines is not None and args.lines < 1:
        print("gpulease: --lines must be 1 or more", file=sys.stderr)
        return 2
    path = f"api/logs/{quote(user)}" + (f"/{quote(server)}" if server else "")
    data = client.call("GET", path, params={"lines": args.lines} if args.lines else None)
    text = shown_text(data.get("log") or "")
    if data.get("shape") == "cluster":
        print(f"# the full log is Kubernetes': {data.get('full_log')}", file=sys.stderr)
        if data.get("failed_start_at"):
            print(f"# the last lines of its last failed start ({data['failed_start_at']}):",
                  file=sys.stderr)
        elif not text:
            print("# gpulease kept nothing of it: no start of it failed", file=sys.stderr)
    elif data.get("truncated"):
        print(f"# only the end of {data.get('file')}", file=sys.stderr)
    sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
    return 0


LOGS_COMMANDS = {"logs": cmd_logs}
