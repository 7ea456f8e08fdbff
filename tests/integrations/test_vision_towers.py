"""transformers vision towers behind the shipped adapters (`vgc.integrations.transformers`): unmodified towers
with seeded random weights, compared item by item with their own forward; the manager compiled by vgc and
replayed through the graph stand-in (`simulated_capture`)."""

import functools

import pytest
import torch

import vgc
from vgc.encoder import EncoderCudaGraphConfig, SupportsEncoderCudaGraph
from vgc.integrations.transformers import encoder_manager, vision_adapter
from conftest import items_close

transformers = pytest.importorskip("transformers")

# fp32: the adapters run the towers' own modules; varlen attention and compiled pieces change rounding only.
TOL = dict(atol=1e-5, rtol=1e-5)
PATCH = 4   # pixels per patch side: a 2x2 merge window is 8x8 pixels, one output token


def qwen2_vl():
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    config = Qwen2VLVisionConfig(depth=2, embed_dim=32, hidden_size=24, num_heads=2, mlp_ratio=2, patch_size=PATCH,
                                 temporal_patch_size=2, in_channels=3, spatial_merge_size=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VisionTransformerPretrainedModel(config).eval()


def qwen2_5_vl():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    # windows of 32 pixels = 4x4 output tokens; layers 1 and 3 attend over whole frames
    config = Qwen2_5_VLVisionConfig(depth=4, hidden_size=32, out_hidden_size=24, num_heads=2, intermediate_size=48,
                                    patch_size=PATCH, temporal_patch_size=2, in_channels=3, spatial_merge_size=2,
                                    window_size=32, fullatt_block_indexes=[1, 3])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2_5_VisionTransformerPretrainedModel(config).eval()


def fixed_size_tower(family: str):
    """SigLIP's or CLIP's vision model: 16x16-pixel images of 4x4-pixel patches."""
    config_class, model_class = {"siglip": (transformers.SiglipVisionConfig, transformers.SiglipVisionModel),
                                 "clip": (transformers.CLIPVisionConfig, transformers.CLIPVisionModel)}[family]
    config = config_class(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          image_size=16, patch_size=4, attn_implementation="sdpa")
    torch.manual_seed(0)
    return model_class(config).eval()


QWEN_OPTIONS = dict(max_frame_pixels=96 * 96, min_pixels=16 * 16, max_batch_tokens=256)


def qwen_request(grids, seed=0):
    """Packed patches as the processor lays them out, for items of (frames, rows, columns) in patches."""
    g = torch.Generator().manual_seed(seed)
    patches = sum(t * h * w for t, h, w in grids)
    return {"pixel_values": torch.randn(patches, 3 * 2 * PATCH * PATCH, generator=g),
            "grid_thw": torch.tensor(grids, dtype=torch.long).reshape(-1, 3)}


def tower_items(adapter, mm):
    """The tower's own forward, cut per item."""
    with torch.no_grad():
        out = adapter(**mm)
    return list(torch.split(out, [s.output_tokens for s in adapter.get_encoder_cudagraph_item_specs(mm)]))


assert_items_close = functools.partial(items_close, **TOL)


# Frames of 2x2 .. 12x16 patches (edge windows smaller than 4x4 tokens), a two-frame video, one item alone.
QWEN_REQUESTS = [[(1, 4, 6), (2, 8, 8), (1, 12, 16)], [(1, 2, 2)], [(1, 16, 4), (1, 6, 10)]]


@pytest.mark.parametrize("make", [qwen2_vl, qwen2_5_vl], ids=["qwen2_vl", "qwen2_5_vl"])
def test_qwen_adapters_give_the_towers_own_outputs_per_item(make):
    tower = make()
    adapter = vision_adapter(tower, **QWEN_OPTIONS)
    assert isinstance(adapter, SupportsEncoderCudaGraph) and adapter.tower is tower
    weights = {n: p.data_ptr() for n, p in tower.named_parameters()}
    for seed, grids in enumerate(QWEN_REQUESTS):
        mm = qwen_request(grids, seed)
        specs = adapter.get_encoder_cudagraph_item_specs(mm)
        with torch.no_grad():
            got = adapter.postprocess_encoder_output(adapter.encoder_eager_forward(mm), mm, specs)
        assert_items_close(got, tower_items(adapter, mm))
    assert {n: p.data_ptr() for n, p in tower.named_parameters()} == weights   # used in place, never copied


@pytest.mark.parametrize("family", ["siglip", "clip"])
def test_fixed_size_adapters_give_the_towers_own_outputs_per_image(family):
    tower = fixed_size_tower(family)
    adapter = vision_adapter(tower)
    pixels = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    specs = adapter.get_encoder_cudagraph_item_specs({"pixel_values": pixels})
    assert [s.output_tokens for s in specs] == [adapter.tokens_per_image] * 3
    with torch.no_grad():
        want = tower(pixel_values=pixels).last_hidden_state
        got = adapter.postprocess_encoder_output(adapter.encoder_eager_forward({"pixel_values": pixels}),
                                                 {"pixel_values": pixels}, specs)
    assert_items_close(got, list(want))
    with pytest.raises(ValueError, match=r"pixel_values must be \[images, 3, 16, 16\]"):
        adapter.get_encoder_cudagraph_item_specs({"pixel_values": torch.zeros(1, 3, 32, 32)})


def test_a_qwen2_5_vl_tower_is_one_line_from_compiled_budget_graphs(simulated_capture, fresh_counters, no_cache):
    """Window and full-attention layers, images and a video, a frame over the graphs' largest (eager, by its
    reason): every item equals the tower's own forward; one trace serves every budget, nothing compiles later."""
    tower = qwen2_5_vl()
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_token_budgets=[8, 32, 64])
    manager = encoder_manager(tower, config, adapter_options=QWEN_OPTIONS)
    with vgc.counters.expect(dynamo_traces=1, cudagraph_captures=3):
        manager.capture()
    assert manager.stats()["captured_forward"] == {"default": "compiled"}
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0, cudagraph_captures=0):
        for seed, grids in enumerate(QWEN_REQUESTS + [[(1, 4, 4), (1, 28, 28), (2, 4, 8)]]):
            mm = qwen_request(grids, seed)
            assert_items_close(manager.execute(mm), tower_items(manager.model, mm))
    stats = manager.stats()
    assert stats["path_items"]["default"]["eager"] == 1   # the 28x28-patch frame (> 96x96 pixels)
    assert stats["path_items"]["default"]["replayed"] > 0
    # The pixels are copied once: a selection names rows of the caller's tensor, and the adapter gathers them
    # (in window order) straight into the captured buffer, which the manager then only pads.
    mm = qwen_request([(1, 4, 6), (2, 8, 8), (1, 4, 4)])
    chosen = manager.model.select_encoder_cudagraph_items(mm, [2, 0])
    assert chosen["pixel_values"] is mm["pixel_values"]
    buffers = manager.graphs["default"][64].input_buffers
    values = manager.model.prepare_encoder_cudagraph_replay_buffers(chosen, 8, 8, out=buffers).values
    assert values["pixel_values"].data_ptr() == buffers["pixel_values"].data_ptr()
    assert values["positions"].data_ptr() == buffers["positions"].data_ptr()
    assert_items_close(manager.execute(chosen), tower_items(manager.model, {
        "pixel_values": torch.cat([mm["pixel_values"][152:168], mm["pixel_values"][:24]]),
        "grid_thw": mm["grid_thw"][[2, 0]]}))


def test_a_siglip_tower_graph_runs_its_own_forward_compiled(simulated_capture, fresh_counters, no_cache):
    tower = fixed_size_tower("siglip")
    config = vgc.CompilationConfig(cudagraph_mm_encoder=True)
    manager = encoder_manager(tower, config, adapter_options={"max_images": 4})
    manager.capture()
    assert manager.stats()["captured_forward"] == {"default": "compiled"}
    assert manager.stats()["budgets"]["default"] == [16, 32, 48, 64]   # 1-4 images of 16 tokens
    with vgc.counters.expect(dynamo_traces=0, inductor_compiles=0):
        for count in (1, 3, 6):   # 6 images: two sub-batches
            pixels = torch.randn(count, 3, 16, 16, generator=torch.Generator().manual_seed(count))
            with torch.no_grad():
                want = list(tower(pixel_values=pixels).last_hidden_state)
            assert_items_close(manager.execute({"pixel_values": pixels}), want)


def test_an_unknown_tower_is_refused_by_name():
    with pytest.raises(TypeError, match="vgc has no adapter for Linear; it ships adapters for "
                                        "Qwen2VisionTransformerPretrainedModel.*SupportsEncoderCudaGraph"):
        vision_adapter(torch.nn.Linear(2, 2))


def test_shared_token_dims_are_named_and_checked():
    config = EncoderCudaGraphConfig(buffer_keys=("a", "b", "c"), out_hidden_size=4,
                                    token_dims={"a": {0: "patches"}, "b": {0: "patches"}, "c": 0})
    assert config.shared_dims(("a", "b", "c")) == [[("a", 0), ("b", 0)]]
    assert (config.token_dim("a"), config.token_dim("c"), config.token_dim("x")) == (0, 0, None)
    with pytest.raises(ValueError, match=r"token_dims\['a'\] must be a dim \(int\) or \{dim: name\}"):
        EncoderCudaGraphConfig(buffer_keys=("a",), out_hidden_size=4, token_dims={"a": {0: "x", 1: "y"}})
