"""Graph passes vgc runs inside Inductor on every compiled piece (`manager.PassManager`), and the user's.

`BUILTIN_PASSES` maps each built-in pass's name (its switch in `CompilationConfig.pass_config`) to the function
and whether it is on by default: a pass is on by default only where it was measured to remove work or time.
"""

from __future__ import annotations

from vgc.passes.noop import eliminate_noops

BUILTIN_PASSES = {
    "eliminate_noops": (eliminate_noops, False),
}
