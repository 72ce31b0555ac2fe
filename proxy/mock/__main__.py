"""`python -m tapfix.proxy.mock`: the mock without the CLI (handy while the CLI is being wired)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tapfix.proxy.mock.options import MockOptions
from tapfix.proxy.mock.serve import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tapfix.proxy.mock", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    parser.add_argument(
        "--case", action="append", type=Path, default=[], help="corpus case file (repeatable)"
    )
    parser.add_argument("--scenario", type=Path, help="scenario JSON file")
    parser.add_argument("--chunk-delay-ms", type=float, default=0, help="pause between SSE events")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    opts = MockOptions(cases=args.case, scenario=args.scenario, chunk_delay_ms=args.chunk_delay_ms)
    serve(opts, host=host or "127.0.0.1", port=int(port))


if __name__ == "__main__":
    main()
