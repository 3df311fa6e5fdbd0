"""`python -m envs.sandbox worker`: serve the sandbox queue (its Redis URL from FARM_SANDBOX_REDIS_URL)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from envs.sandbox.jobs import QUEUE, URL_ENV, serve


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.sandbox", description="the code sandbox's rq worker")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser(
        "worker", help=f"serve the sandbox queue; the Redis URL comes from ${URL_ENV}, else the farm's settings"
    )
    w.add_argument("--queue", default=QUEUE)
    w.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    url = os.environ.get(URL_ENV)
    if not url:
        from farm.settings import load_settings

        s = load_settings()
        url = s.redis_url or f"redis://127.0.0.1:{s.embedded_port}/0"
    try:
        serve(url, args.queue, args.name)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
