"""Traffic profiles and the size chooser (`vgc/cudagraph/traffic.py`): the chooser is optimal against brute
force on small random histograms and monotone in its budget; profiles are validated, recorded atomically and
added to across restarts."""

import itertools
import json
import random
import subprocess
import sys

import pytest

from vgc.cudagraph import traffic
from vgc.cudagraph.traffic import choose_sizes, expected_padding, load_profile, ProfileError, TrafficRecorder


def random_histogram(rng: random.Random, sizes: int, largest: int) -> dict[int, int]:
    return {rng.randint(1, largest): rng.randint(1, 50) for _ in range(sizes)}


def brute_force(histogram: dict[int, int], max_sizes: int, top: int, candidates: list[int]) -> int:
    """The least padded tokens of any set of at most max_sizes candidates whose largest is `top`."""
    others = [c for c in candidates if c < top]
    best = None
    for k in range(0, max_sizes):
        for subset in itertools.combinations(others, k):
            cost = expected_padding({s: c for s, c in histogram.items() if s <= top}, [*subset, top]).padded_tokens
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_chosen_sizes_are_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    histogram = random_histogram(rng, rng.randint(1, 9), rng.choice([16, 64, 300]))
    max_sizes = rng.randint(1, 4)
    chosen = choose_sizes(histogram, max_sizes)
    assert len(chosen) <= max_sizes and chosen == sorted(set(chosen))
    assert chosen[-1] == max(histogram)   # the tail is covered: every recorded call has a graph
    assert expected_padding(histogram, chosen).ungraphed_calls == 0
    cost = expected_padding(histogram, chosen).padded_tokens
    assert cost == brute_force(histogram, max_sizes, max(histogram), sorted(histogram))


@pytest.mark.parametrize("seed", range(15))
def test_with_candidates_only_candidates_are_chosen_and_still_optimal(seed):
    rng = random.Random(100 + seed)
    histogram = random_histogram(rng, rng.randint(2, 8), 200)
    candidates = sorted({8 * rng.randint(1, 26) for _ in range(9)} | {208})
    max_sizes = rng.randint(1, 3)
    chosen = choose_sizes(histogram, max_sizes, candidates=candidates)
    assert set(chosen) <= set(candidates)
    top = min(c for c in candidates if c >= max(histogram))
    assert chosen[-1] == top
    assert expected_padding(histogram, chosen).padded_tokens == brute_force(histogram, max_sizes, top, candidates)


@pytest.mark.parametrize("seed", range(10))
def test_more_sizes_never_pad_more(seed):
    rng = random.Random(200 + seed)
    histogram = random_histogram(rng, 60, 256)
    costs = [expected_padding(histogram, choose_sizes(histogram, k)).padded_tokens for k in range(1, 20)]
    assert costs == sorted(costs, reverse=True)
    assert costs[0] == max(histogram) * sum(histogram.values())   # one size: everything pads to the largest
    everything = choose_sizes(histogram, len(histogram))
    assert expected_padding(histogram, everything).waste == 0


def test_cover_leaves_the_rare_tail_without_graphs():
    histogram = {1: 500, 8: 300, 64: 150, 1000: 1}
    chosen = choose_sizes(histogram, 3, cover=0.99)
    assert chosen == [1, 8, 64]
    padding = expected_padding(histogram, chosen)
    assert padding.ungraphed_calls == 1 and padding.waste == 0
    with pytest.raises(ValueError, match="cover must be in"):
        choose_sizes(histogram, 3, cover=0)
    with pytest.raises(ValueError, match="max_sizes must be a positive int"):
        choose_sizes(histogram, 0)
    with pytest.raises(ValueError, match="no candidate size holds 1000"):
        choose_sizes(histogram, 2, candidates=[8, 512])


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


GOOD = {"vgc_traffic_profile": 1, "kind": "decoder", "histograms": {"uniform_decode": {"1": 3, "8": 2}}}


@pytest.mark.parametrize("data, problem", [
    ("{not json", "is not JSON"),
    ([1, 2], "is not a vgc traffic profile"),
    ({**GOOD, "vgc_traffic_profile": 2}, "is not a vgc traffic profile of format 1"),
    ({**GOOD, "kind": "vision"}, "has kind 'vision'"),
    ({**GOOD, "histograms": []}, "has no 'histograms' object"),
    ({**GOOD, "histograms": {"uniform_decode": [1, 2]}}, "must map sizes to counts"),
    ({**GOOD, "histograms": {"uniform_decode": {"0": 3}}}, "has size '0'"),
    ({**GOOD, "histograms": {"uniform_decode": {"1.5": 3}}}, "has size '1.5'"),
    ({**GOOD, "histograms": {"uniform_decode": {"x": 3}}}, "has size 'x'"),
    ({**GOOD, "histograms": {"uniform_decode": {"4": -1}}}, "counts -1 calls"),
    ({**GOOD, "histograms": {"uniform_decode": {"4": 2.5}}}, "counts 2.5 calls"),
    ({**GOOD, "histograms": {"uniform_decode": {"4": True}}}, "counts True calls"),
])
def test_a_bad_profile_is_a_clear_error(tmp_path, data, problem):
    with pytest.raises(ProfileError, match=problem):
        load_profile(write(tmp_path / "p.json", data))


def test_profile_kind_and_missing_file(tmp_path):
    path = write(tmp_path / "p.json", GOOD)
    assert load_profile(path).combined() == {1: 3, 8: 2}
    with pytest.raises(ProfileError, match="records decoder traffic, but an encoder profile is needed"):
        load_profile(path, "encoder")
    with pytest.raises(ProfileError, match="cannot be read"):
        load_profile(tmp_path / "missing.json")


def test_the_recorder_writes_at_exit_and_adds_to_an_existing_profile(tmp_path):
    path = tmp_path / "traffic.json"
    script = (f"from vgc.cudagraph.traffic import TrafficRecorder\n"
              f"r = TrafficRecorder({str(path)!r}, 'decoder', every_s=3600)\n"
              "for n in (1, 1, 8): r.add('uniform_decode', n)\n"
              "r.add('other', 37)\n")
    for _ in range(2):   # the second process adds to what the first wrote
        subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    profile = load_profile(path, "decoder")
    assert profile.histograms == {"uniform_decode": {1: 4, 8: 2}, "other": {37: 2}}


def test_a_damaged_profile_is_replaced_with_a_warning_and_an_unwritable_one_only_warns(tmp_path, caplog):
    path = tmp_path / "traffic.json"
    path.write_text("garbage")
    recorder = TrafficRecorder(path, "decoder")
    assert "is not JSON" in caplog.text
    recorder.add("uniform_decode", 4)
    recorder.flush()
    assert load_profile(path).histograms == {"uniform_decode": {4: 1}}
    gone = TrafficRecorder(tmp_path / "no-such-dir" / "t.json", "decoder")
    gone.add("uniform_decode", 1)
    gone.flush()
    assert "not written" in caplog.text and gone.profile().histograms == {"uniform_decode": {1: 1}}
    assert not list(tmp_path.glob(".*.tmp"))   # no temporary file left behind
    assert traffic.tail_size({1: 1, 2: 1}, 0.5) == 1


def test_profile_show_prints_histograms_and_chosen_sizes_with_their_padding(tmp_path, capsys):
    from vgc.shells.cli import main as vgc_main

    histogram = {1: 50, 2: 20, 7: 10, 30: 5, 700: 1}
    path = write(tmp_path / "p.json", {**GOOD, "histograms": {"uniform_decode": {str(k): v for k, v in
                                                                                  histogram.items()}}})
    assert vgc_main(["profile", "show", path, "--max-graphs", "2,4"]) == 0
    out = capsys.readouterr().out
    assert "uniform_decode: 86 calls, 5 distinct sizes 1-700" in out
    assert "1 above 512 run without a graph" in out
    served = {n: c for n, c in histogram.items() if n <= 512}
    for k in (2, 4):
        sizes = choose_sizes(served, k)
        waste = expected_padding(histogram, sizes).waste
        assert f"{f'<= {k} graphs':14s} {len(sizes):6d} {waste:8.1%} {1:9d}  {', '.join(map(str, sizes))}" in out
    assert "default (67)" in out
    assert vgc_main(["profile", "show", str(tmp_path / "none.json")]) == 2
    assert "cannot be read" in capsys.readouterr().out
    assert vgc_main(["profile", "show", path, "--max-graphs", "0"]) == 2


def test_a_dropped_recorder_writes_what_it_counted(tmp_path):
    import gc

    path = tmp_path / "t.json"
    recorder = TrafficRecorder(path, "encoder", every_s=3600)
    recorder.add("default.tokens", 64)
    del recorder
    gc.collect()
    assert load_profile(path, "encoder").histograms == {"default.tokens": {64: 1}}


def test_value_order_puts_the_largest_first_then_what_saves_most_per_token():
    histogram = {1: 100, 2: 50, 8: 30, 64: 5, 256: 1}
    order = traffic.value_order(histogram, [1, 2, 4, 8, 16, 64, 128, 256])
    assert order[0] == 256 and order[1] == 1 and sorted(order) == [1, 2, 4, 8, 16, 64, 128, 256]
    assert order.index(4) > order.index(8)   # no call is of size 3 or 4: a 4 only saves for the calls of 2 already
    assert traffic.value_order(histogram, []) == []
