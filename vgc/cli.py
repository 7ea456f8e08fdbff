"""The `vgc` command: `vgc demo`, `vgc cache ...`, `vgc bench ...`."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgc", description="vgc: a piecewise torch.compile backend")
    parser.add_argument("-v", "--verbose", action="store_true", help="log vgc's INFO messages")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="compile the tiny reference decoder and compare with eager")
    demo.add_argument("--cache-root", help="cache root to use (default: a new temporary directory)")
    demo.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")

    bench = commands.add_parser("bench", help="benchmarks: startup (cold vs warm), decode (per-step latency, GPU)")
    bench.add_argument("name", choices=["startup", "decode"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the benchmark (see --help)")

    from vgc.cache import cli as cache_cli

    cache_cli.add_parser(commands)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.command == "demo":
        from vgc import demo as demo_module

        return demo_module.main(cache_root=args.cache_root, device=args.device)
    if args.command == "cache":
        return cache_cli.run(args)
    if args.command == "bench":
        import importlib

        return importlib.import_module(f"vgc.bench.{args.name}").main(args.args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
