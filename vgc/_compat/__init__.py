"""Every private torch API vgc uses lives here, and nothing else.

"Private" means anything under a `torch._*` module, a `_`-prefixed name, an undocumented attribute (a SymInt's
`.node`, a ShapeEnv's guards, Dynamo's node metadata), or a public API whose spelling differs between the torch
versions vgc supports (2.11 to 2.15). Torch may move any of these in a release; keeping them in one module makes
that release one file to adapt, and lets the rest of vgc read as plain public torch.

The package is split by the part of torch it reaches into; everything is used as `_compat.<name>`, so that one
place (this module's namespace) is where a test replaces a function.
"""

from vgc._compat.graphs import (
    custom_op_function, direct_kernel, flash_varlen_attention, flash_varlen_forward, generated_forward,
    graph_code_files, graph_returns_tuple, op_schema, op_schemas, op_tags, operator_names, placeholder_source_name,
    qualified_name, set_traced_value, source_name, split_module, traced_value)
from vgc._compat.shapes import (
    detect_fake_mode, fake_inputs, fake_propagation, is_fake, python_text, shape_guards, size_hint, symbol_sources,
    symbolic_expr)
from vgc._compat.inductor import (
    clear_inductor_memory_caches, cpu_vec_isa, CustomGraphPass, functorch_config_portable, inductor_cache_dir,
    inductor_code_name, inductor_config_portable, inductor_cpp_compiler, inductor_custom_passes,
    inductor_option_names, load_artifact, precompile_header_wrapped, save_artifact, standalone_compile,
    start_triton_driver, torch_build_key, torch_source_key, triton_source_key, wrap_cpu_isa_check, wrap_cpu_isa_probe)
from vgc._compat.inductor_load import compiler_modules_imported, torch_extern_kernels
from vgc._compat.dynamo import (
    allow_recompiles, assume_equal, backed_size_oblivious, device_from_inputs, dynamo_compile_id,
    forget_size_history, has_module_hooks, mark_dynamic, mark_unbacked, maybe_mark_dynamic,
    model_state_guard_filter, no_duck_shape, register_bytecode_hook, skip_all_guards, tensor_checker,
    through_dynamo, traced_code_objects, tracing_context, untraceable_errors, within_tracing_context)
from vgc._compat.precompile import (
    aot_backend_result, aot_bytecode, aot_capture, aot_guard_failure, aot_import_module_aliases,
    aot_precompile_available, aot_program_bytes, aot_program_load, aot_signature, aot_skip_guards,
    aot_source_modules, SerializableCallable)
from vgc._compat.runtime import (
    copy_many, default_store, reduced_fp32_matmuls, register_backend_by_name, tree_flatten, tree_leaves, tree_map,
    tree_unflatten)

__all__ = [
    "custom_op_function", "direct_kernel", "flash_varlen_attention", "flash_varlen_forward", "generated_forward",
    "graph_code_files", "graph_returns_tuple", "op_schema", "op_schemas", "op_tags", "operator_names",
    "placeholder_source_name", "qualified_name", "set_traced_value", "source_name", "split_module", "traced_value",
    "detect_fake_mode", "fake_inputs", "fake_propagation", "is_fake", "python_text", "shape_guards", "size_hint",
    "symbol_sources", "symbolic_expr", "clear_inductor_memory_caches", "cpu_vec_isa", "CustomGraphPass",
    "functorch_config_portable", "inductor_cache_dir", "inductor_code_name", "inductor_config_portable",
    "inductor_cpp_compiler", "inductor_custom_passes", "inductor_option_names", "load_artifact",
    "precompile_header_wrapped", "save_artifact", "standalone_compile", "torch_build_key", "torch_source_key",
    "start_triton_driver", "triton_source_key", "wrap_cpu_isa_check", "wrap_cpu_isa_probe",
    "compiler_modules_imported", "torch_extern_kernels",
    "allow_recompiles", "assume_equal", "backed_size_oblivious", "device_from_inputs", "dynamo_compile_id",
    "forget_size_history", "has_module_hooks", "mark_dynamic", "mark_unbacked", "maybe_mark_dynamic",
    "model_state_guard_filter", "no_duck_shape", "register_bytecode_hook", "skip_all_guards", "tensor_checker",
    "through_dynamo", "traced_code_objects", "tracing_context", "untraceable_errors", "within_tracing_context",
    "aot_backend_result",
    "aot_bytecode", "aot_capture", "aot_guard_failure", "aot_import_module_aliases", "aot_precompile_available",
    "aot_program_bytes", "aot_program_load", "aot_signature", "aot_skip_guards", "aot_source_modules",
    "SerializableCallable", "copy_many", "default_store", "reduced_fp32_matmuls", "register_backend_by_name",
    "tree_flatten",
    "tree_leaves", "tree_map", "tree_unflatten"
]
