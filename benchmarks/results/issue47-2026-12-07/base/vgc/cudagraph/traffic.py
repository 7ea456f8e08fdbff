"""Traffic profiles: what a running model was called with, as histograms, and the graph sizes they make worth
capturing.

A profile is a small JSON file (`vgc.compile(..., record=PATH)`, `EncoderCudaGraphManager(..., record=PATH)`):

    {"vgc_traffic_profile": 1, "kind": "decoder",
     "histograms": {"uniform_decode": {"1": 412, "8": 30}, "other": {"37": 5, "512": 2}}}

Each histogram maps a size (tokens per call, or per encoder sub-batch and path) to how many calls had it. A
profile is input, not code: `load_profile` validates it and a bad file is a `ProfileError` naming the problem.

`choose_sizes` picks the capture sizes (decoder) or token budgets (encoder) that minimise the expected padded
work over a histogram: each call runs at the smallest chosen size that holds it, and costs that many tokens. The
largest chosen size covers the traffic's tail (by default every recorded call), so padding, not a graph miss,
is the price of a smaller set.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from vgc.cache.layout import atomic_write
from vgc.cudagraph.padding import padded_size

logger = logging.getLogger("vgc")

FORMAT_VERSION = 1
KINDS = ("decoder", "encoder")
_MAX_SIZE = 1 << 40   # a size past this is not a token count


class ProfileError(ValueError):
    """A traffic profile that cannot be used: the message names the file, the problem and the fix."""


@dataclass
class TrafficProfile:
    kind: str
    histograms: dict[str, dict[int, int]] = field(default_factory=dict)

    def combined(self, names: Iterable[str] | None = None) -> dict[int, int]:
        """The sum of the named histograms (default: all)."""
        total: Counter = Counter()
        for name, histogram in self.histograms.items():
            if names is None or name in names:
                total.update(histogram)
        return dict(total)

    def to_json(self) -> dict:
        return {"vgc_traffic_profile": FORMAT_VERSION, "kind": self.kind,
                "histograms": {name: {str(size): count for size, count in sorted(h.items())}
                               for name, h in sorted(self.histograms.items())}}


def load_profile(path: str | os.PathLike, kind: str | None = None) -> TrafficProfile:
    """The profile at `path`, checked; `ProfileError` when it is missing, not JSON, of another format or kind, or
    holds anything but positive int sizes with positive int counts."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ProfileError(f"traffic profile {path} cannot be read ({e.strerror or e}); record one with "
                           "vgc.compile(..., record=PATH) or pass an existing file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ProfileError(f"traffic profile {path} is not JSON ({e}); record it again") from None
    return parse_profile(data, str(path), kind)


def parse_profile(data, where: str, kind: str | None = None) -> TrafficProfile:
    if not isinstance(data, dict) or data.get("vgc_traffic_profile") != FORMAT_VERSION:
        raise ProfileError(f"traffic profile {where} is not a vgc traffic profile of format {FORMAT_VERSION} "
                           "(its 'vgc_traffic_profile' field); record it again with this vgc")
    found = data.get("kind")
    if found not in KINDS:
        raise ProfileError(f"traffic profile {where} has kind {found!r}; expected one of {list(KINDS)}")
    if kind is not None and found != kind:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ProfileError(f"traffic profile {where} records {found} traffic, but {article} {kind} profile is needed "
                           "here")
    histograms = data.get("histograms")
    if not isinstance(histograms, dict):
        raise ProfileError(f"traffic profile {where} has no 'histograms' object")
    parsed = {}
    for name, histogram in histograms.items():
        if not isinstance(histogram, dict):
            raise ProfileError(f"traffic profile {where}: histogram {name!r} must map sizes to counts")
        parsed[name] = {}
        for size, count in histogram.items():
            try:
                n = int(size)
            except (TypeError, ValueError):
                n = None
            if n is None or str(n) != str(size).strip() or not 1 <= n <= _MAX_SIZE:
                raise ProfileError(f"traffic profile {where}: histogram {name!r} has size {size!r}; sizes are "
                                   "positive ints")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ProfileError(f"traffic profile {where}: histogram {name!r} counts {count!r} calls of size "
                                   f"{n}; counts are positive ints")
            parsed[name][n] = count
    return TrafficProfile(found, parsed)


class TrafficRecorder:
    """Counts sizes per histogram and writes the profile to `path`: atomically, every `every_s` seconds while
    calls come, at `flush()`, when the recorder is dropped and when the process exits. Recording costs a dict
    increment per call. A profile already at `path` (of the same kind) is added to, so restarts accumulate; an
    unusable one is replaced, with a warning."""

    def __init__(self, path: str | os.PathLike, kind: str, every_s: float = 30.0):
        self.path = os.fspath(path)
        self.kind = kind
        self.every_s = every_s
        base = TrafficProfile(kind)
        if os.path.exists(self.path):
            try:
                base = load_profile(self.path, kind)
            except ProfileError as e:
                logger.warning("%s; recording a new profile there", e)
        self._state = _Recording(self.path, base)
        self.counts = self._state.counts
        self._flushed_at = time.monotonic()
        # the state, not the recorder: a dropped recorder's last counts are still written
        weakref.finalize(self, self._state.flush, only_if_new=True)

    def add(self, name: str, size: int) -> None:
        histogram = self.counts.get(name)
        if histogram is None:
            histogram = self.counts[name] = Counter()
        histogram[size] += 1
        if time.monotonic() - self._flushed_at > self.every_s:
            self.flush()

    def profile(self) -> TrafficProfile:
        return self._state.profile()

    def flush(self) -> None:
        """Write what was recorded so far; a write that fails is logged, and recording goes on."""
        self._flushed_at = time.monotonic()
        self._state.flush()


class _Recording:
    def __init__(self, path: str, base: TrafficProfile):
        self.path, self.base = path, base
        self.counts: dict[str, Counter] = {}
        self.lock = threading.Lock()
        self.written: dict[str, dict[int, int]] | None = None

    def profile(self) -> TrafficProfile:
        merged = {name: Counter(h) for name, h in self.base.histograms.items()}
        for name, histogram in list(self.counts.items()):
            merged.setdefault(name, Counter()).update(dict(histogram))
        return TrafficProfile(self.base.kind, {name: dict(h) for name, h in merged.items()})

    def flush(self, only_if_new: bool = False) -> None:
        with self.lock:
            profile = self.profile()
            if only_if_new and (not self.counts or profile.histograms == self.written):
                return
            try:
                atomic_write(Path(self.path), json.dumps(profile.to_json(), indent=1).encode())
            except OSError as e:
                logger.warning("traffic profile %s not written (%s); recording goes on in memory", self.path,
                               e.strerror or e)
                return
            self.written = profile.histograms


# ---- choosing sizes ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Padding:
    calls: int
    tokens: int            # the calls' own tokens
    graphed_tokens: int    # the own tokens of the calls a graph serves
    padded_tokens: int     # what those calls run: their sizes padded up
    ungraphed_calls: int   # calls above every size

    @property
    def waste(self) -> float:
        """Padding as a fraction of the tokens the graphs run."""
        return 1 - self.graphed_tokens / self.padded_tokens if self.padded_tokens else 0.0


def expected_padding(histogram: Mapping[int, int], sizes: Iterable[int]) -> Padding:
    """What serving `histogram` with graphs of `sizes` costs in padding, and how many calls get no graph."""
    ordered = sorted(set(sizes))
    calls = tokens = graphed = padded = ungraphed = 0
    for size, count in histogram.items():
        calls += count
        tokens += size * count
        target = padded_size(size, ordered)
        if target is None:
            ungraphed += count
        else:
            graphed += size * count
            padded += target * count
    return Padding(calls, tokens, graphed, padded, ungraphed)


def tail_size(histogram: Mapping[int, int], cover: float = 1.0) -> int:
    """The smallest size that at least `cover` of the calls fit in (1.0: the largest recorded)."""
    if not histogram:
        raise ValueError("an empty histogram has no sizes to choose from")
    if not 0 < cover <= 1:
        raise ValueError(f"cover must be in (0, 1], got {cover}")
    total = sum(histogram.values())
    seen = 0
    for size in sorted(histogram):
        seen += histogram[size]
        if seen >= cover * total - 1e-9:
            return size
    return max(histogram)


def choose_sizes(histogram: Mapping[int, int], max_sizes: int, *, cover: float = 1.0,
                 candidates: Iterable[int] | None = None) -> list[int]:
    """At most `max_sizes` sizes minimising the padded tokens of the calls in `histogram`, the largest being the
    smallest candidate that holds the `cover` quantile of the calls (calls above it run without a graph).

    Exact: an optimal set only uses sizes that are recorded (or, with `candidates`, the smallest candidate that
    holds a recorded size), so a dynamic program over them, O(max_sizes * n^2) for n distinct sizes, finds it.
    """
    if isinstance(max_sizes, bool) or not isinstance(max_sizes, int) or max_sizes < 1:
        raise ValueError(f"max_sizes must be a positive int, got {max_sizes!r}")
    top = tail_size(histogram, cover)
    if candidates is not None:
        pool = sorted({c for c in candidates if c >= 1})
        rounded = padded_size(top, pool)
        if rounded is None:
            raise ValueError(f"no candidate size holds {top}, the size the traffic's tail needs (largest candidate "
                             f"{pool[-1] if pool else None})")
        top = rounded
        # each recorded size is served by the smallest candidate holding it: those are the only useful sizes
        values = sorted({padded_size(s, pool) for s in histogram if s <= top} - {None})
    else:
        values = sorted(s for s in histogram if s <= top)
    counts = Counter()
    for size, count in histogram.items():
        if size <= top:
            counts[padded_size(size, values)] += count
    m = len(values)
    # prefix[i]: the calls at values[0..i-1]
    prefix = [0] * (m + 1)
    for i, v in enumerate(values):
        prefix[i + 1] = prefix[i] + counts[v]
    k_max = min(max_sizes, m)
    inf = math.inf
    # best[k][j]: the least padded tokens serving values[0..j] with k sizes, the largest being values[j]
    best = [[inf] * m for _ in range(k_max + 1)]
    choice = [[-1] * m for _ in range(k_max + 1)]
    for j in range(m):
        best[1][j] = prefix[j + 1] * values[j]
    for k in range(2, k_max + 1):
        for j in range(k - 1, m):
            v = values[j]
            row, out, arg = best[k - 1], inf, -1
            for i in range(k - 2, j):
                cost = row[i] + (prefix[j + 1] - prefix[i + 1]) * v
                if cost < out:
                    out, arg = cost, i
            best[k][j], choice[k][j] = out, arg
    k = min(range(1, k_max + 1), key=lambda n: (best[n][m - 1], n))
    chosen, j = [], m - 1
    while k >= 1 and j >= 0:
        chosen.append(values[j])
        j, k = choice[k][j], k - 1
    return sorted(chosen)


# ---- the decoder's capture sizes ---------------------------------------------------------------------------------

def decoder_histogram(profile: TrafficProfile) -> dict[int, int]:
    """Every call a decoder profile recorded, uniform decode or not: one capture list serves both graph kinds."""
    return profile.combined()


def capture_sizes_from_profile(profile: TrafficProfile, max_graphs: int, largest: int) -> list[int]:
    """The capture sizes a decoder profile makes worth capturing: at most `max_graphs`, none above `largest`
    (calls above it run without a graph)."""
    histogram = {size: count for size, count in decoder_histogram(profile).items() if size <= largest}
    if not histogram:
        raise ProfileError(f"the traffic profile records no call of at most {largest} tokens "
                           "(max_cudagraph_capture_size): no capture size can serve it")
    return choose_sizes(histogram, max_graphs)


def value_order(histogram: Mapping[int, int], sizes: Iterable[int]) -> list[int]:
    """`sizes` in the order a memory budget should keep them: the largest first (every recorded call up to it
    pads into a graph), then greedily the size that saves the most padded tokens per token of its own (a graph's
    memory grows with its size) given those before it."""
    remaining = sorted(set(sizes))
    if not remaining:
        return []
    order = [remaining.pop()]
    while remaining:
        base = expected_padding(histogram, order).padded_tokens
        best = max(remaining, key=lambda s: ((base - expected_padding(histogram, [*order, s]).padded_tokens) / s,
                                             -s))
        order.append(best)
        remaining.remove(best)
    return order
