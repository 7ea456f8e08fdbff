"""Symbolic sizes and fake tensors: the shape environment's symbols, sources and guards.

Part of `vgc._compat`: every private torch API vgc uses (see its docstring)."""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys

import sympy
import torch

from vgc._compat.graphs import source_name


# ---- Symbolic sizes: the shape environment's symbols, sources and guards ------------------------------------------

def symbolic_expr(value: torch.SymInt) -> sympy.Expr:
    """The sympy expression behind a SymInt, in the ShapeEnv's canonical symbols: sizes Dynamo proved equal are
    one symbol. Read from the SymInt's node, which is no public API; newer torch applies the replacements when
    reading `.expr`, older torch does not, and applying them twice changes nothing."""
    node = value.node
    shape_env = getattr(node, "shape_env", None)
    expr = node.expr
    return shape_env.replace(expr) if shape_env is not None else expr


def _shape_env(fake_mode):
    return getattr(fake_mode, "shape_env", None) if fake_mode is not None else None


def symbol_sources(fake_mode) -> dict[sympy.Symbol, str]:
    """Each size symbol's first source, by name ("L['x'].size()[0]"), from the fake mode's ShapeEnv (whose
    `var_to_sources` is undocumented); {} without a ShapeEnv."""
    shape_env = _shape_env(fake_mode)
    if shape_env is None:
        return {}
    return {symbol: source_name(sources[0]) for symbol, sources in shape_env.var_to_sources.items() if sources}


# "if x.shape[0] > 4:  # model.py:7 in forward (_dynamo/variables/tensor.py:2606 in evaluate_expr)": the user's
# line, then the torch frame that made the guard, which says nothing to a user.
_TORCH_FRAME = re.compile(r"\s*\([^()]*\.py:\d+ in [^()]*\)$")


def shape_guards(fake_mode) -> list[tuple[sympy.Basic, str]]:
    """The shape guards recorded so far in the fake mode's ShapeEnv, in order: (expression, the user code that
    made torch guard, or ""). A ShapeEnv's guard list and their source locations are undocumented."""
    shape_env = _shape_env(fake_mode)
    if shape_env is None:
        return []
    return [(guard.expr, _user_line(str(getattr(guard, "sloc", "") or ""))) for guard in shape_env.guards]


def _user_line(where: str) -> str:
    """torch's location of a guard as the user's line only, its file named in full."""
    return _USER_FILE.sub(_full_user_file, _TORCH_FRAME.sub("", where.strip()))


# torch names the user's file relative to the directory it shares with torch's own (`shorten_filename`); where
# that is only "/", it cuts the first character of the path's first name too ("/tmp/m.py" becomes "mp/m.py").
_USER_FILE = re.compile(r"(?<=# )(\S+\.py)(?=:\d+ in )")


def _full_user_file(match: re.Match) -> str:
    """The loaded source file that torch's shortened name stands for (unique), else the name as torch gave it."""
    short = match.group(1)
    if os.path.isabs(short):
        return short
    loaded = {getattr(module, "__file__", None) for module in list(sys.modules.values())} | set(linecache.cache)
    found = {path for path in loaded if isinstance(path, str) and path.endswith(short) and
             (path[:-len(short)].endswith(os.sep) or len(path) - len(short) == 2)}
    return found.pop() if len(found) == 1 else short


def size_hint(value) -> int | None:
    """A size's value in the trace, read without adding a guard; None for a size the trace has no value for
    (unbacked)."""
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return None if hint is None else int(hint)
    return int(value)


def python_text(expr) -> str | None:
    """A sympy expression of torch's shape functions (FloorDiv, PythonMod, ...) as Python source, by torch's own
    printer (private); None where it cannot print it."""
    try:
        from torch.utils._sympy.printers import PythonPrinter

        return PythonPrinter().doprint(expr)
    except Exception:   # noqa: BLE001 - an older or newer torch: the caller falls back to sympy's own text
        return None


# ---- Fake tensors -------------------------------------------------------------------------------------------------

def detect_fake_mode(inputs: list):
    """The FakeTensorMode Dynamo traced `inputs` under, or None outside Dynamo (private `torch._guards`)."""
    return torch._guards.detect_fake_mode(inputs)


def is_fake(tensor: torch.Tensor) -> bool:
    """A fake tensor (shapes only, no data), as Dynamo and Inductor trace with (private `torch._subclasses`)."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(tensor)


@contextlib.contextmanager
def fake_propagation(fake_mode):
    """Run ops on `fake_mode`'s tensors as Dynamo propagates them: through the Python dispatcher (private
    `torch._dispatch.python`), so composite ops decompose in Python on symbolic sizes, and adding no guard to
    Dynamo's shape environment (private `ShapeEnv.suppress_guards`). For re-running a traced graph only to learn
    its pieces' input shapes. Without the Python dispatcher, torch 2.11's C++ matmul on CUDA asks for concrete
    sizes and pins the token count of transformers' rotary embedding; the trace already holds every guard it
    needs."""
    from torch._dispatch.python import enable_python_dispatcher

    shape_env = getattr(fake_mode, "shape_env", None)
    with fake_mode, enable_python_dispatcher(), \
            (shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()):
        yield


def fake_inputs(fake_mode, inputs: list) -> list:
    """`inputs` with every tensor replaced by a fake tensor of `fake_mode` (sizes stay symbolic; a fake of another
    mode is re-made in this one)."""
    return [x if isinstance(x, torch.Tensor) and getattr(x, "fake_mode", None) is fake_mode
            else fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
