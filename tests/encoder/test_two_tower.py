"""The reference two-tower encoder (`vgc.models.two_tower`) and the manager's dual-path graphs on the CPU: capture
and replay through the graph stand-in (`simulated_cuda`), compared item by item with the model's eager forward."""

import functools

import pytest
import torch

import vgc
from vgc.encoder import EncoderCudaGraphManager, SupportsEncoderCudaGraph
from vgc.models import two_tower
from vgc.models.vit import patch_grid
from conftest import items_close

# fp32: graph replays pad with zero views and compiled towers reorder reductions; both change rounding only.
TOL = dict(atol=1e-5, rtol=1e-5)
CFG = two_tower.tiny_config()   # 4 global tokens per image, 2 local tokens per crop, budgets 4..32 tokens
GLOBAL, LOCAL = CFG.global_tokens, CFG.local_tokens


@pytest.fixture(scope="module")
def model():
    return two_tower.TwoTowerEncoder(CFG).eval()


def eager(model, mm):
    with torch.no_grad():
        return model(**mm)


assert_items_close = functools.partial(items_close, **TOL)


def deltas(before):
    return {k: getattr(vgc.counters, k) - v for k, v in before.items()}


def snapshot():
    return {k: getattr(vgc.counters, k) for k in ("encoder_replays", "encoder_eager_runs")}


# Whole images on the global path, whole crops on the local one: both paths get budgets 4, 8, 12, 20 and 32.
BUDGETS = [4, 8, 12, 20, 32]


def captured_manager(model, compile=False, **config):
    config.setdefault("encoder_cudagraph_token_budgets", BUDGETS)
    manager = EncoderCudaGraphManager(model, vgc.CompilationConfig(cudagraph_mm_encoder=True, **config),
                                      compile=compile)
    manager.capture()
    return manager


# ---- the model ----
def test_the_two_tower_encoder_implements_the_dual_path_protocol(model):
    assert isinstance(model, SupportsEncoderCudaGraph)
    config = model.get_encoder_cudagraph_config()
    assert config.enable_dual_path_graph and config.paths() == ("global", "local")
    assert (config.global_token_per_image, config.local_token_per_patch) == (GLOBAL, LOCAL) == (4, 2)
    assert config.keys_for("global") == ("global_pixel_values",)
    assert config.keys_for("local") == ("local_pixel_values",)
    assert dict(config.token_dims) == {"global_pixel_values": 0, "local_pixel_values": 0}
    assert model.get_encoder_cudagraph_budget_range(None) == (4, 32)
    bench = two_tower.bench_config()
    assert (bench.global_tokens, bench.local_tokens, bench.dtype) == (256, 100, torch.bfloat16)


def test_each_image_is_its_crops_tokens_then_its_global_tokens(model):
    mm = two_tower.make_images(CFG, [0, 3, 1], seed=1)
    out = eager(model, mm)
    assert [tuple(o.shape) for o in out] == [(GLOBAL, 24), (3 * LOCAL + GLOBAL, 24), (LOCAL + GLOBAL, 24)]
    specs = model.get_encoder_cudagraph_item_specs(mm)
    assert [(s.output_tokens, s.global_output_tokens, s.local_output_tokens) for s in specs] == \
        [(4, 4, 0), (10, 4, 6), (6, 4, 2)]
    assert [s.input_size for s in specs] == [16, 16 + 3 * 8, 16 + 8]
    with torch.no_grad():
        glo = model.encoder_eager_forward(mm, "global")
        loc = model.encoder_eager_forward(mm, "local")
    assert glo.shape == (3 * GLOBAL, 24) and loc.shape == (4 * LOCAL, 24)
    torch.testing.assert_close(out[1], torch.cat([loc[:6], glo[4:8]]))
    torch.testing.assert_close(out[2], torch.cat([loc[6:], glo[8:]]))
    # A crop attends only to itself: encoding it alone gives the same tokens.
    alone = model.select_encoder_cudagraph_items(mm, [2])
    torch.testing.assert_close(eager(model, alone)[0], out[2], **TOL)
    assert eager(model, two_tower.make_images(CFG, [])) == []


def test_selecting_items_slices_both_paths_in_the_given_order(model):
    mm = two_tower.make_images(CFG, [2, 0, 1, 3], seed=2)
    want = eager(model, mm)
    order = [3, 1, 0, 2]
    picked = model.select_encoder_cudagraph_items(mm, order)
    assert picked["num_crops"].tolist() == [3, 0, 2, 1]
    assert picked["local_pixel_values"].shape[0] == 6 * CFG.patches("local")
    assert_items_close(eager(model, picked), [want[i] for i in order])
    none = model.select_encoder_cudagraph_items(mm, [1])
    assert none["local_pixel_values"].shape == (0, CFG.patch_dim)
    assert_items_close(eager(model, none), [want[1]])


def test_patchify_writes_each_views_patches_in_merge_window_order():
    images = torch.arange(2 * 16 * 16, dtype=torch.float32).reshape(2, 1, 16, 16)
    patches = two_tower.patchify(CFG, images)
    assert patches.shape == (2 * 16, CFG.patch_dim)
    rows, cols = patch_grid(4, 4, CFG.merge)
    top_left = (rows * CFG.patch_size * 16 + cols * CFG.patch_size).long()   # first pixel of each patch
    assert torch.equal(patches[:16, 0].long(), top_left)
    assert torch.equal(patches[16:, 0].long(), top_left + 256)


# ---- the manager: dual-path graphs ----
def test_budgets_are_whole_images_and_whole_crops(model):
    manager = EncoderCudaGraphManager(model, compile=False)
    budgets = manager.stats()["budgets"]
    assert budgets["global"][0] == GLOBAL and budgets["global"][-1] == 32
    assert budgets["local"][0] == 0 and budgets["local"][-1] == 32
    assert all(b % GLOBAL == 0 for b in budgets["global"]) and all(b % LOCAL == 0 for b in budgets["local"])


def test_replays_equal_eager_for_images_with_and_without_crops(model, simulated_cuda):
    manager = captured_manager(model)
    stats = manager.stats()
    graphs = len(stats["captured"]["global"]) + len(stats["captured"]["local"])
    assert stats["captured"] == {"global": BUDGETS, "local": BUDGETS} and stats["budgets"]["local"][0] == 0
    assert simulated_cuda.cudagraph_captures == graphs == 10

    mm = two_tower.make_images(CFG, [0, 3, 1, 0, 5], seed=3)   # 20 global and 18 local tokens: one sub-batch
    before = snapshot()
    outputs = manager.execute(mm)
    assert_items_close(outputs, eager(model, mm))
    assert deltas(before) == {"encoder_replays": 2, "encoder_eager_runs": 0}   # one graph per path
    stats = manager.stats()
    assert stats["path_items"] == {"global": {"replayed": 5, "exact": 0, "eager": 0},
                                   "local": {"replayed": 5, "exact": 0, "eager": 0}}
    assert stats["replays"] == {"global": {20: 1}, "local": {20: 1}}
    kept = [o.clone() for o in outputs]

    mm = two_tower.make_images(CFG, [0, 0, 0], seed=4)   # no crops at all: the local path does not run
    before = snapshot()
    assert_items_close(manager.execute(mm), eager(model, mm))
    assert deltas(before) == {"encoder_replays": 1, "encoder_eager_runs": 0}
    stats = manager.stats()
    assert stats["path_items"] == {"global": {"replayed": 8, "exact": 0, "eager": 0},
                                   "local": {"replayed": 5, "exact": 0, "eager": 0}}
    assert stats["replays"]["global"] == {12: 1, 20: 1}

    # Smaller batches after larger ones (stale views in the budget buffers must not leak in), and more images
    # than one sub-batch holds (8): packed into two sub-batches, returned in the caller's order.
    for crops in ([1], [2, 0], [0, 1, 2, 0, 1, 2, 0, 1, 2, 3]):
        mm = two_tower.make_images(CFG, crops, seed=len(crops))
        assert_items_close(manager.execute(mm), eager(model, mm))
    stats = manager.stats()
    assert stats["items_missed"] == 0 and stats["hit_rate"] == 1.0 and simulated_cuda.encoder_eager_runs == 0
    assert simulated_cuda.encoder_replays == sum(n for path in stats["replays"].values() for n in path.values())
    assert_items_close(outputs, kept)   # outputs are the caller's: later replays do not overwrite them


def test_an_image_with_more_crops_than_any_local_budget_runs_its_local_path_eagerly(model, simulated_cuda):
    manager = captured_manager(model)   # the largest local budget: 32 tokens, 16 crops
    mm = two_tower.make_images(CFG, [1, 20, 0, 2], seed=5)   # image 1: 40 local tokens
    before = snapshot()
    assert_items_close(manager.execute(mm), eager(model, mm))
    # The three others: one sub-batch replaying both paths. Image 1 alone: its global view replays, its crops
    # run eagerly.
    assert deltas(before) == {"encoder_replays": 3, "encoder_eager_runs": 1}
    stats = manager.stats()
    assert (stats["items_hit"], stats["items_missed"]) == (3, 1)
    assert stats["path_items"] == {"global": {"replayed": 4, "exact": 0, "eager": 0},
                                   "local": {"replayed": 3, "exact": 0, "eager": 1}}
    assert stats["replays"] == {"global": {4: 1, 12: 1}, "local": {8: 1}}


def test_chosen_budgets_are_rounded_to_whole_views_per_path(model, simulated_cuda):
    manager = captured_manager(model, encoder_cudagraph_token_budgets=[5, 8, 16])
    assert manager.stats()["captured"] == {"global": [8, 16], "local": [6, 8, 16]}
    mm = two_tower.make_images(CFG, [3, 0, 9], seed=6)   # image 2: 18 local tokens, over the local 16
    assert_items_close(manager.execute(mm), eager(model, mm))
    assert manager.stats()["path_items"]["local"] == {"replayed": 2, "exact": 0, "eager": 1}


def test_without_graphs_each_path_runs_at_the_sub_batch_size(model, fresh_counters):
    manager = EncoderCudaGraphManager(model, vgc.CompilationConfig(cudagraph_mm_encoder=False), compile=False)
    manager.capture()
    mm = two_tower.make_images(CFG, [2, 0, 4], seed=7)
    with vgc.counters.expect(encoder_replays=0, encoder_eager_runs=0, cudagraph_captures=0):
        assert_items_close(manager.execute(mm), eager(model, mm))
    assert manager.stats()["padding_waste"] == 0.0


def test_vgc_compiles_each_tower_once_and_never_on_a_request(model, simulated_cuda):
    with vgc.counters.expect(dynamo_traces=2):   # one trace per path serves all its budgets
        manager = captured_manager(model, compile=True, encoder_cudagraph_token_budgets=[8, 16, 32])
    assert vgc.counters.inductor_compiles > 0
    mm = two_tower.make_images(CFG, [0, 2, 1], seed=8)
    assert_items_close(manager.execute(mm), eager(model, mm))
    mm = two_tower.make_images(CFG, [3, 0, 1, 4, 0, 2], seed=9)   # other image and crop counts, other budgets
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, cudagraph_captures=0) as d:
        assert_items_close(manager.execute(mm), eager(model, mm))
    assert d["encoder_replays"] == 2 and d["encoder_eager_runs"] == 0
