"""Budget levels and greedy packing (`vgc.encoder.pack`): properties over random item sets, single and dual path."""

import random

import pytest

from vgc.encoder import EncoderItemSpec, PathBudgets, budget_levels, pack


def _check_partition(batches, n):
    placed = sorted(i for b in batches for i in b.indices)
    assert placed == list(range(n)), "every item is placed exactly once"


def _smallest_fit(levels: PathBudgets, items, tokens, frames):
    fitting = [b for b in levels.budgets if b >= max(tokens, 1) and
               items <= levels.capacity(b)[0] and frames <= levels.capacity(b)[1]]
    return min(fitting) if fitting else None


def test_budget_levels_bound_the_padding_and_keep_the_largest():
    levels = budget_levels(64, 16384)
    assert levels[0] == 64 and levels[-1] == 16384
    assert all(b % 64 == 0 for b in levels)
    assert all(later <= max(earlier * 1.25, earlier + 64) for earlier, later in zip(levels, levels[1:-1]))
    assert budget_levels(64, 16384, growth=2) == [64 * 2 ** k for k in range(9)]   # the seed's powers of two
    assert budget_levels(64, 1000, growth=2) == [64, 128, 256, 512, 1000]        # the largest, off the grid
    assert budget_levels(100, 100) == [100]
    with pytest.raises(ValueError, match="1 <= smallest <= largest"):
        budget_levels(0, 10)


def test_single_path_packing_properties():
    rng = random.Random(0)
    for trial in range(300):
        budgets = sorted(rng.sample(range(8, 400, 8), rng.randint(1, 6)))
        max_items, max_frames = rng.randint(1, 6), rng.choice([None, rng.randint(1, 10)])
        specs = [EncoderItemSpec(input_size=rng.randint(1, 99), output_tokens=rng.randint(1, 450),
                                 frames=rng.choice([1, 1, 1, 2, 4])) for _ in range(rng.randint(0, 12))]
        levels = PathBudgets(tuple(budgets), max_items, max_frames or max_items)
        batches = pack(specs, budgets, max_items, max_frames=max_frames)
        _check_partition(batches, len(specs))
        order = sorted(range(len(specs)), key=lambda i: (specs[i].output_tokens, i))
        graphed = [b for b in batches if b.budget is not None]
        for b in batches:
            tokens = sum(specs[i].output_tokens for i in b.indices)
            frames = sum(specs[i].frames for i in b.indices)
            assert b.tokens["default"] == tokens and len(b.indices) <= max_items
            if b.budget is None:   # eager: an item over every budget, alone
                assert len(b.indices) == 1
                assert tokens > budgets[-1] or frames > levels.max_frames
            else:
                assert tokens <= b.budget and frames <= levels.max_frames
                assert b.budget == _smallest_fit(levels, len(b.indices), tokens, frames)
        # Greedy, smallest first: the graphed items, in batch order, are the sorted order of the fitting items.
        assert [i for b in graphed for i in b.indices] == [i for i in order if any(i in b.indices for b in graphed)]
        # A batch closes only when the next item would overflow it.
        for b, following in zip(graphed, graphed[1:]):
            nxt = following.indices[0]
            tokens = sum(specs[i].output_tokens for i in b.indices) + specs[nxt].output_tokens
            frames = sum(specs[i].frames for i in b.indices) + specs[nxt].frames
            assert len(b.indices) == max_items or tokens > budgets[-1] or frames > levels.max_frames, trial


def test_per_budget_capacity_moves_a_crowded_batch_to_a_larger_budget():
    levels = PathBudgets((64, 128, 256), max_items=8, max_frames=8, unit=64)
    assert levels.capacity(64) == (1, 1) and levels.capacity(128) == (2, 2) and levels.capacity(256) == (8, 8)
    specs = [EncoderItemSpec(4, 20), EncoderItemSpec(4, 20)]   # 40 tokens, but two sequences
    [batch] = pack(specs, levels, 8)
    assert batch.budget == 128


def test_items_over_every_budget_run_eagerly_one_by_one():
    specs = [EncoderItemSpec(1, t) for t in (500, 10, 700, 30)]
    batches = pack(specs, [64, 128], 4)
    assert [(b.indices, b.budget) for b in batches] == [((1, 3), 64), ((0,), None), ((2,), None)]


def test_an_item_with_an_eager_reason_runs_alone_eagerly_on_every_path_though_it_fits():
    specs = [EncoderItemSpec(1, 10), EncoderItemSpec(1, 20, eager_reason="frame longer than the captured maximum"),
             EncoderItemSpec(1, 30)]
    batches = pack(specs, [64, 128], 4)
    assert [(b.indices, b.budget) for b in batches] == [((0, 2), 64), ((1,), None)]
    dual = [EncoderItemSpec(1, 8, global_output_tokens=8, local_output_tokens=16, eager_reason="too long"),
            EncoderItemSpec(1, 8, global_output_tokens=8, local_output_tokens=16)]
    batches = pack(dual, {"global": [16, 32], "local": [0, 32, 64]}, 4)
    assert [(b.indices, dict(b.budgets)) for b in batches] == [((1,), {"global": 16, "local": 32}),
                                                                ((0,), {"global": None, "local": None})]


def test_dual_path_packing_properties_and_the_four_fallback_cases():
    rng = random.Random(1)
    g_unit, l_unit = 16, 10
    global_budgets, local_budgets = [16, 32, 64, 128], [0, 10, 20, 40, 80]
    seen = set()
    for _ in range(300):
        specs = []
        for _ in range(rng.randint(0, 10)):
            images = rng.choice([1, 1, 1, 9])          # 9 images' worth of global tokens overflows the global path
            crops = rng.choice([0, 0, 1, 3, 9])        # 9 crops overflow the local path
            specs.append(EncoderItemSpec(1, images * g_unit + crops * l_unit, global_output_tokens=images * g_unit,
                                         local_output_tokens=crops * l_unit))
        batches = pack(specs, {"global": global_budgets, "local": local_budgets}, 4)
        _check_partition(batches, len(specs))
        for b in batches:
            g = sum(specs[i].global_output_tokens for i in b.indices)
            loc = sum(specs[i].local_output_tokens for i in b.indices)
            assert b.tokens == {"global": g, "local": loc}
            assert b.budget == (min(x for x in global_budgets if x >= g) if g <= 128 else None)
            if loc == 0:
                assert b.local_budget == 0   # no patches: the local path is skipped, never replayed
            else:
                assert b.local_budget == (min(x for x in local_budgets if x >= loc) if loc <= 80 else None)
            seen.add((b.budget is not None, b.local_budget is not None and b.local_budget > 0, loc == 0))
    # graph+graph, graph+skip (no patches), eager global+graph local, graph global+eager local, eager+eager
    assert {(True, True, False), (True, False, True), (False, True, False), (True, False, False),
            (False, False, False)} <= seen


def test_pack_rejects_a_bad_item_limit():
    with pytest.raises(ValueError, match="max_items must be an int >= 1"):
        pack([EncoderItemSpec(1, 1)], [8], 0)
