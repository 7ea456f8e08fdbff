"""Graph passes: vgc's built-in ones and the user's.

Most passes run inside Inductor on every compiled piece (`manager.PassManager`, stage "post_grad"). A pass that
needs the model's real parameters runs on the split graph before any piece compiles (stage "split"). Each built-in
pass has a switch in `CompilationConfig.pass_config` and is on by default only where it was measured to remove
work or time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vgc.passes import outer_product, skinny_fusion, skinny_matmul
from vgc.passes.noop import eliminate_noops
from vgc.passes.sibling_matmul import fuse_sibling_linears


@dataclass(frozen=True)
class BuiltinPass:
    run: Callable
    default: bool
    stage: str   # "post_grad": inside Inductor, per piece; "split": on the split graph, before compiling
    options: Callable[[], Any] | None = None   # what else decides the pass's output: part of its identity
    requires: str | None = None   # a pass whose output this one works on: off with it


BUILTIN_PASSES = {
    "eliminate_noops": BuiltinPass(eliminate_noops, default=False, stage="post_grad"),
    # transformers' rotary angles (an fp32 matmul with K = 1) as a multiply that fuses into the cos/sin kernel
    "outer_products": BuiltinPass(outer_product.rewrite_outer_products, default=True, stage="post_grad",
                                  options=outer_product.options),
    "fuse_sibling_matmuls": BuiltinPass(fuse_sibling_linears, default=True, stage="split"),
    "skinny_matmuls": BuiltinPass(skinny_matmul.use_skinny_matmuls, default=True, stage="post_grad",
                                  options=skinny_matmul.options),
    # After skinny_matmuls (this order): it fuses around the ops that pass put in.
    "skinny_matmul_fusion": BuiltinPass(skinny_fusion.fuse_skinny_neighbours, default=True, stage="post_grad",
                                        requires="skinny_matmuls"),
    # q and k's rotary embedding into the fused qkv matmul
    "skinny_matmul_rope": BuiltinPass(skinny_fusion.fuse_rotary, default=True, stage="post_grad",
                                      requires="skinny_matmul_fusion"),
}


def enabled(name: str, pass_config: dict[str, bool]) -> bool:
    """`name` is switched on, and so is every pass it works on."""
    required = BUILTIN_PASSES[name].requires
    return bool(pass_config.get(name)) and (required is None or enabled(required, pass_config))
