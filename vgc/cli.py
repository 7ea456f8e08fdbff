"""The `vgc` command: `vgc demo`, `vgc cache ...`, `vgc bench ...`, and the options every command accepts.

A global option is declared once, in a parent parser that every subcommand's parser includes, so it can be
written before or after the subcommand (`vgc -v demo`, `vgc demo -v`). Under a subcommand it defaults to
`argparse.SUPPRESS`: a subcommand that does not see the option leaves the value parsed earlier in place.
"""

from __future__ import annotations

import argparse
import logging
import sys


def global_options(default: object) -> argparse.ArgumentParser:
    """vgc's own options as a parent parser: `default` is their default on `vgc` itself, `argparse.SUPPRESS` on a
    subcommand. Each call makes new actions, so the two defaults never mix."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="log vgc's INFO messages (cache misses, cache directories)")
    return parent


def _version() -> str:
    import torch

    from vgc import __version__

    return f"vgc {__version__} (torch {torch.__version__}, Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vgc", description="vgc: a piecewise torch.compile backend",
                                     parents=[global_options(False)])
    common = global_options(argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", parents=[common],
                               help="compile the tiny reference decoder and compare with eager")
    demo.add_argument("--cache-root", help="cache root to use and keep (default: a temporary directory, removed "
                                           "at the end)")
    demo.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")

    bench = commands.add_parser("bench", parents=[common], help="benchmarks: startup (cold vs warm), decode "
                                "(per-step latency, GPU), encoder (vision encoder request latency, GPU), hf "
                                "(transformers models, GPU), generate (transformers generate()); arguments after the name go to the benchmark")
    benchmarks = bench.add_subparsers(dest="name", required=True, metavar="{startup,decode,encoder,hf,generate}")
    # No -h of their own: `vgc bench startup --help` reaches the benchmark's parser, which lists its arguments.
    for name, text in (("startup", "cold vs warm time to first output, each in a fresh process"),
                       ("decode", "per-step latency of every execution strategy (CUDA)"),
                       ("encoder", "vision encoder request latency of every execution strategy (CUDA; "
                                   "--model tiny runs on the CPU)"),
                       ("hf", "unmodified transformers Llama and ViT under every execution strategy (CUDA)"),
                       ("generate", "transformers generate() on every path, vgc's integration included (CUDA; "
                                    "--model tiny runs on the CPU)")):
        benchmarks.add_parser(name, parents=[common], add_help=False, help=f"{text}; see its --help")

    from vgc.cache import cli as cache_cli

    cache_cli.add_parser(commands, common)
    from vgc.cudagraph import profile_cli

    profile_cli.add_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # A benchmark's own arguments are left unparsed here and handed to its parser; any other command must use them all.
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if args.command == "demo":
        from vgc import demo as demo_module

        return demo_module.main(cache_root=args.cache_root, device=args.device)
    if args.command == "cache":
        from vgc.cache import cli as cache_cli

        return cache_cli.run(args)
    if args.command == "profile":
        from vgc.cudagraph import profile_cli

        return profile_cli.run(args)
    import importlib

    return importlib.import_module(f"vgc.bench.{args.name}").main(rest)


if __name__ == "__main__":
    sys.exit(main())
