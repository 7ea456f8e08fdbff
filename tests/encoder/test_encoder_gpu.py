"""Encoder CUDA graphs on a real GPU: budget graphs around flash varlen attention equal the eager encoder."""

import dataclasses
import random

import pytest
import torch

import vgc
from vgc.encoder import EncoderCudaGraphManager
from vgc.models import vit

pytestmark = pytest.mark.gpu

# bf16: the compiled pieces fuse differently from eager, and padded rows change nothing but rounding.
BF16_TOL = dict(atol=3e-2, rtol=3e-2)


@pytest.fixture(scope="module")
def small_vit():
    # Qwen2-VL's patching (14 px, 2x2 merge, temporal 2) at a small width and depth: quick to compile and capture.
    cfg = dataclasses.replace(vit.qwen2_vl_vit_config(), depth=4, dim=256, num_heads=4, mlp_dim=1024, out_hidden=512,
                              max_batch_tokens=4096)
    return cfg, vit.VisionEncoder(cfg).cuda().eval()


def _eager(model, mm):
    with torch.no_grad():
        out = model(**mm)
    return list(torch.split(out, [s.output_tokens for s in model.get_encoder_cudagraph_item_specs(mm)]))


def _request(cfg, rng, videos):
    sides = [rng.choice([224, 336, 448, (224, 672), 672, 896]) for _ in range(rng.randint(1, 4))]
    frames = [1] * len(sides)
    if videos:   # item 0 a video of 8 or 16 frames, at most 8 x 144 tokens
        sides[0], frames[0] = rng.choice([224, 336]), rng.choice([8, 16])
    return vit.make_images(cfg, sides, frames=frames, device="cuda", seed=rng.randint(0, 10 ** 6))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager-forward", "vgc-compiled"])
def test_budget_graphs_equal_eager_for_images_videos_and_mixed(small_vit, compiled, tmp_path, monkeypatch):
    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path))
    cfg, model = small_vit
    manager = EncoderCudaGraphManager(model, vgc.CompilationConfig(cudagraph_mm_encoder=True), compile=compiled)
    stats = manager.capture()
    assert stats["graphs"] and len(stats["captured"]["default"]) == len(stats["budgets"]["default"])
    rng = random.Random(0)
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, cudagraph_captures=0):
        for step in range(10):
            mm = _request(cfg, rng, videos=step % 2 == 1)
            got, want = manager.execute(mm), _eager(model, mm)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, **BF16_TOL)
    stats = manager.stats()
    assert stats["items_missed"] == 0 and stats["items_hit"] > 10
    smallest = min(stats["captured"]["default"])
    assert stats["graph_savings"]["default"][smallest] > 0.1   # launch-bound: the graph must pay for itself there
    assert stats["path_items"]["default"]["replayed"] > 0


def test_items_over_every_budget_fall_back_to_eager(small_vit):
    cfg, model = small_vit
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[64, 256])
    manager = EncoderCudaGraphManager(model, config, compile=False, calibrate=False)   # replay whatever fits
    manager.capture()
    mm = vit.make_images(cfg, [224, 896, 336], device="cuda", seed=1)   # 64, 1024 and 144 tokens
    with vgc.counters.expect(encoder_eager_runs=1, encoder_replays=1):
        got = manager.execute(mm)
    for g, w in zip(got, _eager(model, mm)):
        torch.testing.assert_close(g, w, **BF16_TOL)
    assert (manager.stats()["items_hit"], manager.stats()["items_missed"]) == (2, 1)
    assert sum(manager.stats()["graph_memory_bytes"]["default"].values()) > 0   # smaller graphs reuse the pool


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_transformers_towers_through_the_shipped_adapter_equal_their_own_forward(family, tmp_path, monkeypatch):
    """An unmodified transformers tower (small width, Qwen's patching and windows), bf16, real budget graphs around
    flash varlen attention: every item within bf16 tolerance of the tower's own (SDPA) forward."""
    pytest.importorskip("transformers")
    from vgc.integrations.transformers import encoder_manager

    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path))
    common = dict(depth=4, num_heads=4, patch_size=14, temporal_patch_size=2, in_channels=3, spatial_merge_size=2)
    if family == "qwen2_vl":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig as Config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as Tower
        config = Config(embed_dim=256, hidden_size=512, mlp_ratio=4, **common)
    else:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as Config
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel as Tower)
        config = Config(hidden_size=256, out_hidden_size=512, intermediate_size=1024, window_size=112,
                        fullatt_block_indexes=[1, 3], **common)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = Tower(config).cuda().to(torch.bfloat16).eval()
    manager = encoder_manager(tower, vgc.CompilationConfig(cudagraph_mm_encoder=True),
                              adapter_options=dict(max_batch_tokens=4096))
    manager.capture()
    assert manager.stats()["captured_forward"] == {"default": "compiled"}
    cfg = dataclasses.replace(vit.qwen2_vl_vit_config(), max_batch_tokens=4096)
    rng = random.Random(1)
    for step in range(6):
        mm = _request(cfg, rng, videos=step % 3 == 2)
        with torch.no_grad():
            want = manager.model(**mm)
        want = torch.split(want, [s.output_tokens for s in manager.model.get_encoder_cudagraph_item_specs(mm)])
        for i, (got, ref) in enumerate(zip(manager.execute(mm), want)):
            torch.testing.assert_close(got, ref, **BF16_TOL, msg=f"step {step}, item {i}")
    assert manager.stats()["path_items"]["default"]["replayed"] > 0
