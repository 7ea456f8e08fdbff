"""Explicit checks that replace Dynamo's dropped shape guards.

`vgc.compile` drops every guard after its single trace, so a call that breaks a size assumption of the traced graph
would otherwise run the wrong code silently. Each call checks the size relations Dynamo guarded on instead (e.g.
`input_ids` and `positions` have the same length, or a model's `if x.shape[0] > 4`), and those Inductor added.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Callable

import sympy

from vgc import _compat
from vgc.capture.paths import follow, InputMismatchError, parse_size_source, size_name, SizeLocation

logger = logging.getLogger("vgc")


@dataclass
class SizeGuard:
    """One relation between dynamic sizes that the traced graph relies on."""
    text: str                                  # e.g. "input_ids.size(0) == positions.size(0)"
    origin: str                                # the user code that made Dynamo guard, when known
    sizes: list[SizeLocation]                  # where each symbol's value is read, in order
    evaluate: Callable[..., bool]
    condition: bool = True   # a condition on a size (a branch, a bound), not an equality between sizes

    def check(self, arguments: dict[str, Any]) -> None:
        values = [follow(arguments[arg], steps).shape[dim] for arg, steps, dim in self.sizes]
        if not self.evaluate(*values):
            raise InputMismatchError(
                f"these inputs break an assumption of the traced graph: {self.text} "
                f"(sizes {', '.join(f'{size_name(s)}={v}' for s, v in zip(self.sizes, values))})"
                f"{'; it comes from: ' + self.origin if self.origin else ''}. The traced graph is only valid for "
                "such inputs; trace with inputs on the other side, "
                f"{'set compile_ranges_max_size so that warmup() traces each side of it, ' if self.condition else ''}"
                "or make the code size-independent")


def snapshot_shape_guards(fake_mode) -> list[tuple[sympy.Basic, str, dict[sympy.Symbol, str]]]:
    """Dynamo's shape guards so far (before Inductor adds its own), with each symbol's source name."""
    sources = _compat.symbol_sources(fake_mode)
    return [(expr, origin, {s: sources.get(s, "?") for s in expr.free_symbols})
            for expr, origin in _compat.shape_guards(fake_mode)]


def build_size_guards(snapshot, resolve: Callable[[SizeLocation], SizeLocation | None],
                      by_inductor: bool = False, conditions_level: int | None = logging.WARNING) -> list[SizeGuard]:
    """Per-call checks for the shape guards of a trace; `resolve` maps where Dynamo read a size to where it is in
    the call's bound arguments (None: not in them). `by_inductor` for the assumptions Inductor added;
    `conditions_level` logs each condition that is not an equality (None: not logged; compile ranges expect
    them, and log at INFO)."""
    guards, seen = [], set()
    for expr, origin, sources in snapshot:
        symbols = sorted(expr.free_symbols, key=str)
        if by_inductor and _is_size_one_specialisation(expr):
            continue   # sizes 0 and 1 run the general code by design (docs/dynamic-shapes.md)
        locations = {symbol: parse_size_source(sources.get(symbol, "")) for symbol in symbols}
        locations = {symbol: where and resolve(where) for symbol, where in locations.items()}
        # Symbols vgc cannot read from the arguments keep Dynamo's name for them (e.g. a buffer of the model).
        text = _render(expr, {symbol: size_name(where) if where else sources.get(symbol, str(symbol))
                              for symbol, where in locations.items()})
        if text in seen:   # the same assumption from another symbol of one size (or another op): one check
            continue
        seen.add(text)
        if not symbols or None in locations.values():
            logger.warning("the traced graph assumes %s (from %s), which vgc cannot check per call; calls that "
                           "break it will give wrong results", text, origin or "unknown code")
            continue
        guards.append(SizeGuard(text, origin, [locations[s] for s in symbols], _evaluator(expr, symbols),
                                not _is_equality(expr)))
        if conditions_level is None:
            continue
        if by_inductor:
            logger.info("Inductor compiled the symbolic-size code assuming %s; every call is checked against it",
                        text)
        elif not _is_equality(expr):
            logger.log(conditions_level, "the traced graph holds only when %s (from %s), e.g. a branch on a dynamic "
                       "size; calls that break it raise InputMismatchError", text, origin or "unknown code")
    return guards


def _is_size_one_specialisation(expr) -> bool:
    """`s >= 2`, `s > 1` or `s != 1` (`s != 0`): what a backed size assumes after a trace at a larger size. Which
    of them Inductor records depends on the path (keying an artifact for the cache adds `s != 1`)."""
    if isinstance(expr, sympy.Ne):
        return any(isinstance(a, sympy.Symbol) and b in (0, 1) for a, b in (expr.args, expr.args[::-1]))
    if isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan, sympy.LessThan, sympy.StrictLessThan)):
        lhs, rhs = (expr.lhs, expr.rhs) if isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan)) else \
            (expr.rhs, expr.lhs)
        bound = 2 if isinstance(expr, (sympy.GreaterThan, sympy.LessThan)) else 1
        return isinstance(lhs, sympy.Symbol) and rhs == bound
    return False


def _is_equality(expr) -> bool:
    """`s0 == s1`, or `4*s0 == 4*s1` (two sizes that broadcast together, seen through a reshape)."""
    if not isinstance(expr, sympy.Eq):
        return False
    (lc, lhs), (rc, rhs) = (side.as_coeff_Mul() for side in expr.args)
    return lc == rc and isinstance(lhs, sympy.Symbol) and isinstance(rhs, sympy.Symbol)


def _render(expr, names: dict) -> str:
    """`expr` as Python a user can read (`x.size(1) % 8 == 0`, `x.size(1) >= 7`), in the call's terms."""
    with sympy.evaluate(False):   # a renaming, not a new expression: simplifying it again costs a warm start 0.05 s
        expr = expr.xreplace({s: sympy.Symbol(n) for s, n in names.items()})
    if isinstance(expr, sympy.core.relational.Relational) and expr.lhs.could_extract_minus_sign():
        expr = expr.reversedsign   # `-x <= -7` reads as `x >= 7`
    text = _compat.python_text(expr)
    if text is not None:
        return text
    text = str(expr)
    relation = re.fullmatch(r"(Eq|Ne)\((.*), (.*)\)", text)
    return f"{relation[2]} {'==' if relation[1] == 'Eq' else '!='} {relation[3]}" if relation else text


def _evaluator(expr, symbols) -> Callable[..., bool]:
    try:
        fn = sympy.lambdify(symbols, expr, modules="math")
    except Exception:
        fn = None

    def slow(*values):
        return bool(expr.xreplace(dict(zip(symbols, map(sympy.Integer, values)))))

    if fn is None:
        return slow

    def fast(*values):
        try:
            return bool(fn(*values))
        except Exception:  # torch's sympy functions (FloorDiv, Mod variants) that lambdify cannot print
            return slow(*values)
    return fast
