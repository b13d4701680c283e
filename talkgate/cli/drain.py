"""`talkgate drain`: ask a running server to drain (POST /admin/drain), e.g. from a Kubernetes preStop hook,
where an image has Python but maybe no curl. Standard library only: it answers at once."""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

from talkgate.cli import args as cli_args
from talkgate.cli.args import CommandError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "drain", help="drain a running server (POST /admin/drain): /ready 503, new sessions refused, contexts finish",
        description="Drain a running `talkgate serve`, as SIGTERM does but leaving the process up: /ready answers "
                    "503 at once, new sessions are refused, contexts in flight finish up to the server's "
                    "--shutdown-deadline, then its WebSockets close with 1001 (docs/deploy.md). Prints the server's "
                    "answer (JSON).")
    p.add_argument("--url", metavar="URL", default="http://127.0.0.1:8080", help="the server's base URL")
    p.add_argument("--api-key", metavar="KEY", help="its API key (default: the first of TALKGATE_API_KEYS, as serve "
                   "reads them)")
    p.add_argument("--wait", action="store_true", help="return when the drain is over (contexts finished or cut "
                   "off at the deadline, WebSockets closed), not when it has begun")
    p.add_argument("--timeout", metavar="SECONDS", type=cli_args.positive_seconds, default=600.0,
                   help="give up after this long")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    key = args.api_key or next((k for k in os.environ.get("TALKGATE_API_KEYS", "").split(",") if k), None)
    url = args.url.rstrip("/") + "/admin/drain" + ("?wait=true" if args.wait else "")
    request = urllib.request.Request(url, method="POST", data=b"",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = e.reason
        raise CommandError(f"{url}: {e.code} {message}") from None
    except (urllib.error.URLError, OSError) as e:
        raise CommandError(f"{url}: {getattr(e, 'reason', e)}") from None
    json.dump(body, sys.stdout)
    print()
    return 0
