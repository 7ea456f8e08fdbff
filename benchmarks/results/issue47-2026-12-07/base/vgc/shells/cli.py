"""The `vgc` command: `vgc demo`, `vgc cache ...`, `vgc bench ...`, `vgc profile ...`, and the options every command
accepts.

Every command's arguments are declared here, and a command's module (`cache_cli.py`, `profile_cli.py`,
`bench/<name>.py`, `demo.py`, all in `vgc/shells/`) is imported only when that command runs: those modules import
torch, which takes seconds, and `vgc --help` or `vgc cache --help` must not wait for it.

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


class _VersionAction(argparse.Action):
    """`--version`, which names torch's version too: torch is imported only when the option is given, not each time
    the parser is built."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


def _root_option(default: object) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--root", default=default, help="cache root (default: $VGC_CACHE_ROOT or ~/.cache/vgc)")
    return parent


def _add_cache_parser(commands, common: argparse.ArgumentParser) -> None:
    # --root belongs to `cache` and to each of its commands, so `cache --root X ls` and `cache ls --root X` agree;
    # under a command it defaults to SUPPRESS, so that it leaves a --root given before the command alone.
    cache = commands.add_parser("cache", parents=[common, _root_option(None)],
                                help="inspect and manage the compile cache")
    parents = [common, _root_option(argparse.SUPPRESS)]
    sub = cache.add_subparsers(dest="cache_command", required=True,
                               metavar="{ls,show,verify,prune,why-miss,pack,unpack}")
    sub.add_parser("ls", parents=parents,
                   help="list entries: hash, size, age, torch, config digest, sources, what tells them apart")
    show = sub.add_parser("show", parents=parents, help="an entry's key factors, pieces and sizes, or a bundle's "
                                                        "manifest")
    show.add_argument("hash", help="the entry's hash or a unique prefix of it, or a bundle file")
    check = sub.add_parser("verify", parents=parents,
                           help="check everything a start reads (index, artifacts, locks, Inductor's kernels, trust), "
                                "or every byte of a bundle and its fit to this machine; exit 1 if anything is bad, 2 "
                                "if the root cannot be checked")
    check.add_argument("bundle", nargs="?", help="a bundle file to check instead of the root")
    pack = sub.add_parser("pack", parents=parents, help="write entries and the kernels they load to one file")
    pack.add_argument("hashes", nargs="*", metavar="HASH", help="entries to pack (hash prefixes; default: all)")
    pack.add_argument("-o", "--output", required=True, help="the bundle file to write")
    pack.add_argument("--no-kernels", action="store_true",
                      help="leave Inductor's kernel cache out (the target then builds kernels from the artifacts "
                           "at its first start, still without compiling)")
    unpack = sub.add_parser("unpack", parents=parents, help="check a bundle, then install it under the root")
    unpack.add_argument("bundle", help="the bundle file")
    prune = sub.add_parser("prune", parents=parents,
                           help="remove old entries, then least recently used ones above a size")
    prune.add_argument("--older-than", help="e.g. 12h, 7d, 2w")
    prune.add_argument("--max-size", help="e.g. 500M, 2G")
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    why = sub.add_parser("why-miss", parents=parents, help="name the factors that differ between the cache and now")
    why.add_argument("--options", help="the CompilationConfig fields as JSON, as passed to vgc (default: {}, or "
                                       "the stored config of --entry)")
    why.add_argument("--device", choices=["cpu", "cuda"],
                     help="device of the environment to compute (default: that of --entry, else cpu)")
    why.add_argument("--sources", action="append", metavar="DIR",
                     help="where the model's code lives here, when not at the paths the cache was built from "
                          "(repeatable): each traced file is looked for by its path's tail, then by its name")
    why.add_argument("--entry", metavar="HASH",
                     help="compare with this entry only (a hash prefix), using its stored config unless --options "
                          "is given (default: the closest entry)")


def _add_profile_parser(commands, common: argparse.ArgumentParser) -> None:
    profile = commands.add_parser("profile", parents=[common], help="traffic profiles recorded by "
                                  "vgc.compile(..., record=PATH) or EncoderCudaGraphManager(..., record=PATH)")
    actions = profile.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", parents=[common], help="print a profile's histograms and the sizes chosen "
                              "from it, with their expected padding")
    show.add_argument("path", help="the profile's JSON file")
    show.add_argument("--max-graphs", default="4,8,16", help="graph counts to choose sizes for, comma-separated "
                      "(default 4,8,16)")
    show.add_argument("--max-size", type=int, default=None, help="largest size a graph may have (decoder default: "
                      "max_cudagraph_capture_size, 512; encoder: none)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vgc", description="vgc: a piecewise torch.compile backend",
                                     parents=[global_options(False)])
    common = global_options(argparse.SUPPRESS)
    parser.add_argument("--version", action=_VersionAction, help="print vgc's, torch's and Python's versions, "
                                                                   "then exit")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", parents=[common],
                               help="compile the tiny reference decoder and compare with eager")
    demo.add_argument("--cache-root", help="cache root to use and keep (default: a temporary directory, removed "
                                           "at the end)")
    demo.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")

    bench = commands.add_parser("bench", parents=[common], help="benchmarks: startup (cold vs warm), decode "
                                "(per-step latency, GPU), encoder (vision encoder request latency, GPU), hf "
                                "(transformers models, GPU), generate (transformers generate()); arguments after the "
                                "name go to the benchmark")
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

    _add_cache_parser(commands, common)
    _add_profile_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # A benchmark's own arguments are left unparsed here and handed to its parser; any other command must use them all.
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if args.command == "demo":
        from vgc.shells import demo as demo_module

        return demo_module.main(cache_root=args.cache_root, device=args.device)
    if args.command == "cache":
        from vgc.shells import cache_cli

        return cache_cli.run(args)
    if args.command == "profile":
        from vgc.shells import profile_cli

        return profile_cli.run(args)
    import importlib

    import vgc

    vgc._load()   # the public names, and the backend "vgc" for the drop-in rows (a checkout run in place has no
    #               entry point to find it by)
    return importlib.import_module(f"vgc.shells.bench.{args.name}").main(rest)


if __name__ == "__main__":
    sys.exit(main())
