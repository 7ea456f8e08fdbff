"""CompilationConfig: checks and normalisation, the hashed fields and the docs table."""

import dataclasses
import logging
from pathlib import Path

import pytest
import torch

import vgc
from vgc.config import CompileCacheSaveFormat, CUDAGraphMode, DynamicShapesType, config_fields_markdown

CONFIG_DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
BEGIN, END = "<!-- config-fields:begin -->\n", "<!-- config-fields:end -->"


def test_docs_config_table_matches_the_field_declarations():
    text = CONFIG_DOC.read_text()
    documented = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    expected = config_fields_markdown()
    assert documented == expected, ("docs/config.md is stale; put this between its marker comments:\n" + expected)


def test_config_fields_keep_their_names_and_defaults():
    config = vgc.CompilationConfig()
    assert [f.name for f in dataclasses.fields(config)] == [
        "splitting_ops", "compile_sizes", "inductor_compile_config", "compile_sizes_inductor_config",
        "cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_memory_budget_mb",
        "cudagraph_traffic_profile", "cudagraph_max_graphs", "uniform_decode_query_len", "compile_ranges_max_size",
        "dynamic_shapes_config",
        "cache_dir", "compile_cache_save_format", "cudagraph_mm_encoder", "encoder_cudagraph_token_budgets",
        "encoder_cudagraph_max_vision_items_per_batch", "encoder_cudagraph_max_frames_per_batch", "pass_config",
        "inductor_passes", "debug", "piece_backend"]
    assert config.piece_backend == vgc.PieceBackend.INDUCTOR
    assert config.splitting_ops == ["vgc::attention", "vgc::varlen_attention"]
    assert config.dynamic_shapes_config == vgc.DynamicShapesConfig(DynamicShapesType.BACKED)
    assert config.max_cudagraph_capture_size == 512 and config.cudagraph_mode is None


def test_config_hash_covers_the_codegen_fields_and_is_stable():
    config = vgc.CompilationConfig()
    assert set(config.hash_factors()) == {"splitting_ops", "compile_sizes", "inductor_compile_config",
                                          "compile_sizes_inductor_config", "dynamic_shapes_config", "pass_config",
                                          "inductor_passes"}
    # Every existing cache entry is keyed by this value: change it only on purpose (it changed when the graph
    # passes' settings entered the hash, when sibling-matmul fusion was switched on by default, when the
    # skinny_matmuls pass joined the table, off, when it was switched on by default, when skinny_matmul_fusion
    # joined it, on, skinny_matmul_rope, on, and outer_products, on).
    assert config.compute_hash() == "ca0a75b3447c70ff"
    assert vgc.CompilationConfig(debug=True, cudagraph_mode="full", cudagraph_capture_sizes=[4],
                                 max_cudagraph_capture_size=64, cudagraph_memory_budget_mb=100,
                                 cudagraph_traffic_profile="traffic.json", cudagraph_max_graphs=4,
                                 uniform_decode_query_len=4).compute_hash() == config.compute_hash()   # a profile shapes graphs, not code


def test_config_values_are_normalised():
    config = vgc.CompilationConfig(compile_sizes=(8, 1, 8), cudagraph_mode="FULL", cudagraph_capture_sizes=[4, 2, 4],
                                   dynamic_shapes_config={"type": "unbacked"}, compile_cache_save_format="Unpacked",
                                   splitting_ops=("aten::scaled_dot_product_attention",))
    assert config.compile_sizes == [1, 8] and config.cudagraph_capture_sizes == [2, 4]
    assert config.cudagraph_mode is CUDAGraphMode.FULL
    assert config.compile_cache_save_format is CompileCacheSaveFormat.UNPACKED
    assert config.dynamic_shapes_config.type is DynamicShapesType.UNBACKED
    assert config.splitting_ops == ["aten::scaled_dot_product_attention"]
    assert vgc.CompilationConfig(dynamic_shapes_config="backed_size_oblivious").dynamic_shapes_config.type \
        is DynamicShapesType.BACKED_SIZE_OBLIVIOUS


@pytest.mark.parametrize("options, message", [
    ({"compile_sizes": [-3]}, "compile_sizes must be positive ints, got -3"),
    ({"compile_sizes": [True]}, "compile_sizes must be positive ints, got True"),
    ({"compile_sizes": 8}, "compile_sizes must be a list, got int 8"),
    ({"cudagraph_capture_sizes": [0]}, "cudagraph_capture_sizes must be positive ints, got 0"),
    ({"cudagraph_memory_budget_mb": 0}, "cudagraph_memory_budget_mb must be None or a positive number, got 0"),
    ({"cudagraph_memory_budget_mb": "1G"}, "cudagraph_memory_budget_mb must be None or a positive number, got '1G'"),
    ({"cudagraph_max_graphs": 0}, "cudagraph_max_graphs must be a positive int, got 0"),
    ({"uniform_decode_query_len": 0}, "uniform_decode_query_len must be a positive int, got 0"),
    ({"cudagraph_traffic_profile": 3}, "cudagraph_traffic_profile must be a path string or None, got 3"),
    ({"encoder_cudagraph_token_budgets": [2.5]}, "encoder_cudagraph_token_budgets must be positive ints, got 2.5"),
    ({"max_cudagraph_capture_size": 0}, "max_cudagraph_capture_size must be a positive int, got 0"),
    ({"encoder_cudagraph_max_vision_items_per_batch": -1},
     "encoder_cudagraph_max_vision_items_per_batch must be an int >= 0, got -1"),
    ({"encoder_cudagraph_max_frames_per_batch": "2"},
     "encoder_cudagraph_max_frames_per_batch must be None or an int >= 0, got '2'"),
    ({"splitting_ops": ["attention"]}, "splitting_ops entries must be operator names like 'vgc::attention'"),
    ({"inductor_compile_config": ["max_autotune"]}, "inductor_compile_config must be a dict of Inductor options"),
    ({"inductor_compile_config": {"max_autotun": True}},
     "inductor_compile_config: unknown Inductor option 'max_autotun'"),
    ({"cudagraph_mode": "sideways"}, "cudagraph_mode must be one of 'none', 'piecewise', 'full'"),
    ({"compile_cache_save_format": "zip"}, "compile_cache_save_format must be one of 'binary', 'unpacked'"),
    ({"dynamic_shapes_config": 3}, "dynamic_shapes_config must be a DynamicShapesConfig, a dict or one of 'backed'"),
    ({"cache_dir": 3}, "cache_dir must be a path string or None, got 3"),
    ({"cudagraph_mm_encoder": 1}, "cudagraph_mm_encoder must be True or False, got 1"),
    ({"debug": "yes"}, "debug must be True or False, got 'yes'"),
])
def test_bad_config_value_names_field_value_and_fix(options, message):
    with pytest.raises(ValueError) as info:
        vgc.CompilationConfig(**options)
    assert message in str(info.value)


def test_config_fields_log_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="vgc"):
        vgc.CompilationConfig(compile_sizes=[1], cudagraph_mode="piecewise", debug=True, cudagraph_mm_encoder=True,
                              encoder_cudagraph_token_budgets=[64])
    assert caplog.records == []


def test_vgc_compile_takes_a_dict_of_config_fields_and_names_a_bad_one():
    compiled = vgc.compile(torch.nn.Linear(2, 2), config={"compile_sizes": [4], "cudagraph_mode": "none"})
    assert compiled.config == vgc.CompilationConfig(compile_sizes=[4], cudagraph_mode="none")
    with pytest.raises(ValueError, match=r"unknown vgc option\(s\) \['compile_size'\]"):
        vgc.compile(torch.nn.Linear(2, 2), config={"compile_size": [4]})
    with pytest.raises(TypeError, match="config must be a vgc.CompilationConfig or a dict of its fields, got list"):
        vgc.compile(torch.nn.Linear(2, 2), config=[4])
    with pytest.raises(TypeError, match=r"CompilationConfig got unknown field\(s\) \['compile_size'\] \(did you mean "
                                        r"'compile_sizes' for 'compile_size'\?\); accepted fields are \['cache_dir', "):
        vgc.CompilationConfig(compile_size=[4])


def test_a_global_inductor_custom_pass_enters_the_cache_key():
    import torch._inductor.config as inductor_config
    from vgc.cache.keys import environment_factors

    class Pass:
        def __init__(self, version):
            self.version = version

        def __call__(self, graph):
            return None

        def uuid(self):
            return f"user-pass-{self.version}"

    plain = environment_factors("cpu")
    # config.patch, not monkeypatch: monkeypatch's undo deletes a config option it did not see in the module dict
    with inductor_config.patch(post_grad_custom_post_pass=Pass(1)):
        first = environment_factors("cpu")
    with inductor_config.patch(post_grad_custom_post_pass=Pass(2)):
        second = environment_factors("cpu")
    assert plain["inductor_custom_passes"] == {}
    assert first["inductor_custom_passes"] == {"post_grad_custom_post_pass": "user-pass-1"}
    assert second["inductor_custom_passes"] == {"post_grad_custom_post_pass": "user-pass-2"}


def test_each_graph_mode_says_once_which_graphs_it_means():
    meaning = {mode: (mode.has_full, mode.has_piecewise) for mode in CUDAGraphMode}
    assert meaning == {CUDAGraphMode.NONE: (False, False), CUDAGraphMode.PIECEWISE: (False, True),
                       CUDAGraphMode.FULL: (True, False), CUDAGraphMode.FULL_AND_PIECEWISE: (True, True)}
