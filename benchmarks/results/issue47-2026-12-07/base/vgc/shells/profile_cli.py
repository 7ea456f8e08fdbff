"""`vgc profile show PATH`: a recorded traffic profile's histograms, and the sizes it makes worth capturing for a
few graph counts, with the padding each set costs against the default sizes. Its arguments are declared in
`vgc/shells/cli.py`."""

from __future__ import annotations

import argparse

from vgc.config import CompilationConfig
from vgc.cudagraph.traffic import choose_sizes, expected_padding, load_profile, ProfileError, tail_size


def run(args: argparse.Namespace) -> int:
    try:
        counts = sorted({int(k) for k in args.max_graphs.split(",") if k.strip()})
        if not counts or counts[0] < 1:
            raise ValueError
    except ValueError:
        print(f"vgc profile show: --max-graphs must be positive ints separated by commas, got {args.max_graphs!r}")
        return 2
    try:
        profile = load_profile(args.path)
    except ProfileError as e:
        print(f"vgc profile show: {e}")
        return 2
    defaults = CompilationConfig()
    largest = args.max_size or (defaults.max_cudagraph_capture_size if profile.kind == "decoder" else None)
    print(f"traffic profile {args.path}: {profile.kind}")
    for name, histogram in sorted(profile.histograms.items()):
        print(f"  {name}: {_describe(histogram)}")
    groups = {"all calls": profile.combined()} if profile.kind == "decoder" else \
        {name: h for name, h in profile.histograms.items() if name.endswith(".tokens")}
    for title, histogram in groups.items():
        served = {n: c for n, c in histogram.items() if largest is None or n <= largest}
        print(f"\nsizes for {title} ({sum(histogram.values())} calls"
              + (f", {sum(histogram.values()) - sum(served.values())} above {largest} run without a graph" if
                 largest is not None and len(served) < len(histogram) else "") + "):")
        if not served:
            print("  none: every call is above the largest size")
            continue
        rows = [(f"<= {k} graphs", choose_sizes(served, k)) for k in counts]
        if profile.kind == "decoder":
            rows.append((f"default ({len(defaults.resolved_capture_sizes())})", defaults.resolved_capture_sizes()))
        print(f"  {'set':14s} {'graphs':>6s} {'padding':>8s} {'no graph':>9s}  sizes")
        for label, sizes in rows:
            padding = expected_padding(histogram, sizes)
            shown = ", ".join(map(str, sizes)) if len(sizes) <= 24 else \
                ", ".join(map(str, sizes[:12])) + f", ... {sizes[-1]}"
            print(f"  {label:14s} {len(sizes):6d} {padding.waste:8.1%} {padding.ungraphed_calls:9d}  {shown}")
    return 0


def _describe(histogram: dict[int, int]) -> str:
    calls = sum(histogram.values())
    quantiles = ", ".join(f"p{int(q * 100)} {tail_size(histogram, q)}" for q in (0.5, 0.9, 0.99))
    return (f"{calls} calls, {len(histogram)} distinct sizes {min(histogram)}-{max(histogram)}; {quantiles}"
            if histogram else "empty")
