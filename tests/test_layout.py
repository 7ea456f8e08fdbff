"""The package's layout as a rule: every module imports only from its own layer or the layers below it, no
module imports itself back through others, and no vgc import hides inside a function outside the entry points
(where it keeps `vgc --help` and the benches from importing torch's compiler for nothing)."""

import ast
from pathlib import Path

import vgc

PACKAGE = Path(vgc.__file__).parent

# Bottom first. A layer may import from itself and from any layer above it in this list, never below.
LAYERS = [
    ("ground floor", ["vgc._version", "vgc._compat", "vgc.envs", "vgc.log", "vgc.counters", "vgc.distributed",
                      "vgc.cuda_runtime", "vgc.aliasing"]),
    ("custom ops", ["vgc.ops"]),
    ("graph passes", ["vgc.passes"]),
    ("configuration", ["vgc.config"]),
    ("capture", ["vgc.capture"]),
    ("piecewise compilation", ["vgc.piecewise"]),
    ("cache", ["vgc.cache"]),
    ("CUDA graphs", ["vgc.cudagraph"]),
    ("drop-in backend", ["vgc.backend"]),
    ("trace once", ["vgc.trace_once"]),
    ("background compile", ["vgc.background_compile"]),
    ("vgc.compile", ["vgc.api"]),
    ("clients", ["vgc.encoder", "vgc.integrations", "vgc.models"]),
    ("shells", ["vgc", "vgc.__main__", "vgc.shells"]),
]
FUNCTION_LEVEL_IMPORTS_ALLOWED = ("vgc.shells.cli", "vgc.shells.demo", "vgc.shells.bench")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or (prefix != "vgc" and name.startswith(prefix + "."))


def _layer(name: str) -> int:
    found = [i for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes if _within(name, p)]
    assert found, f"{name} is in no layer of tests/test_layout.py: add it where it belongs"
    return max(found)   # "vgc" (the package root) only when nothing more specific matches


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported vgc module, line, inside a function) for each vgc import of module `name`."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target) if target.split(".")[0] == "vgc" else None
            if resolved is not None and resolved != name:
                found.append((resolved, node.lineno, id(node) in in_function))
    return found


def test_every_import_goes_to_the_same_layer_or_below():
    upward = [f"{name}:{line} imports {target} ({LAYERS[_layer(target)][0]}, above {LAYERS[_layer(name)][0]})"
              for name in MODULES for target, line, _ in _imports(name) if _layer(target) > _layer(name)]
    assert upward == []


def test_no_module_imports_itself_through_others():
    edges = {name: {target for target, _, _ in _imports(name)} for name in MODULES}
    cycles = []
    for start in MODULES:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for target in edges[node]:
                if target == start:
                    cycles.append(" -> ".join(path + (start,)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, path + (target,)))
    assert cycles == []


def test_no_function_level_vgc_import_below_the_entry_points():
    hidden = [f"{name}:{line} imports {target} inside a function" for name in MODULES
              if not any(_within(name, p) for p in FUNCTION_LEVEL_IMPORTS_ALLOWED)
              for target, line, in_function in _imports(name) if in_function]
    assert hidden == []


def test_the_layer_table_catches_an_upward_import():
    """The rule can fail: a capture module importing the backend would be reported."""
    assert _layer("vgc.backend") > _layer("vgc.capture.contract")
    assert _layer("vgc.cache.keys") < _layer("vgc.cudagraph.dispatch") < _layer("vgc.api")
    assert _layer("vgc") == len(LAYERS) - 1 and _layer("vgc._version") == 0


def _capturing_lines(text: str) -> list[str]:
    """The lines of a module's source that capture a CUDA graph themselves."""
    spellings = ("cuda_runtime.capture(", "cuda_runtime.end_segment(", "torch.cuda.CUDAGraph(", "torch.cuda.graph(",
                 ".capture_begin(")
    return [line.strip() for line in text.splitlines() if any(s in line for s in spellings)]


def test_every_graph_is_captured_by_the_one_core():
    """One captured-graph type: a whole call is captured only in `captured.capture_graph`, a segment only in
    `segments`, which wraps each in a `CapturedGraph`; no other module records a graph."""
    capturing = {name for name in MODULES if name != "vgc.cuda_runtime"
                 and _capturing_lines(MODULES[name].read_text())}
    assert capturing == {"vgc.cudagraph.captured", "vgc.cudagraph.segments"}, capturing
    assert "CapturedGraph(graph" in MODULES["vgc.cudagraph.segments"].read_text()
    assert _capturing_lines("    graph, out = cuda_runtime.capture(lambda: f(x), pool)\n")   # the rule can fail


def test_no_library_module_is_over_600_lines():
    """Modules do one job; past ~600 lines one has grown a second (the shells' benches are scripts: exempt)."""
    long = {name: n for name, path in MODULES.items() if not name.startswith("vgc.shells")
            if (n := len(path.read_text().splitlines())) > 600}
    assert not long, long
