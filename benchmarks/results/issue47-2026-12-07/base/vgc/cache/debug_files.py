"""Readable debug files written beside the artifacts: the split graph and Dynamo's transformed bytecode."""

from __future__ import annotations

import dis
import io
import logging
import threading

import torch.fx as fx

from vgc import _compat

logger = logging.getLogger("vgc")


# Graphs written per cache directory in this process: graph breaks give one backend call (and file) each.
_graphs_written: dict[str, int] = {}


def write_computation_graph(store, split_gm: fx.GraphModule, pieces) -> str | None:
    if store.directory is None or not store.saving:   # no cache, or a root that takes no writes (warned once)
        return None
    graph_index = _graphs_written.get(str(store.directory), 0)
    _graphs_written[str(store.directory)] = graph_index + 1
    lines = [f"# vgc split graph {graph_index}: {len(pieces)} pieces; "
             "pieces marked [eager] run uncompiled at the splitting ops, the others are compiled by Inductor."]
    for piece in pieces:
        lines.append(f"#   {piece.name}: {'[eager]' if piece.is_splitting else '[compiled]'}")
    body = split_gm.print_readable(print_output=False)
    name = "computation_graph.py" if graph_index == 0 else f"computation_graph_{graph_index}.py"
    try:
        return str(store.write_text(name, "\n".join(lines) + "\n\n" + body))
    except Exception as e:  # a debug file must never break compilation (a full disk, a read-only entry)
        logger.warning("could not write %s under %s (%s); compiling goes on", name, store.directory, e)
        return None


def existing_computation_graph(store, graph_index: int) -> str | None:
    """The split graph a traced start wrote into this entry (a warm start from a saved trace writes none)."""
    name = "computation_graph.py" if graph_index == 0 else f"computation_graph_{graph_index}.py"
    path = store.directory / name
    return str(path) if path.is_file() else None


def write_transformed_code(store, code, new_code) -> None:
    """`transformed_code.py` for a program captured ahead of time (Dynamo calls no bytecode hook then)."""
    if store.directory is None:
        return
    try:
        store.write_text("transformed_code.py", render_transformed_code(code, new_code))
    except Exception as e:  # a debug file must never break compilation
        logger.debug("could not write transformed_code.py: %s", e)


# Dynamo hands the transformed bytecode to hooks only after the backend returns; remember where it goes.
_pending = threading.local()
_hook_handle = None


def expect_transformed_code(store) -> None:
    global _hook_handle
    if store.directory is None:
        return
    _pending.store = store
    if _hook_handle is None:
        _hook_handle = _compat.register_bytecode_hook(_on_bytecode)


def _on_bytecode(code, new_code):
    store = getattr(_pending, "store", None)
    if store is None:
        return None
    _pending.store = None
    write_transformed_code(store, code, new_code)
    return None


def render_transformed_code(code, new_code) -> str:
    header = (f"# Dynamo's transformed bytecode for {code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:"
              f"{code.co_firstlineno}).\n")
    try:
        import depyf

        return header + "# decompiled by depyf\n" + depyf.decompile(new_code)
    except Exception:
        out = io.StringIO()
        dis.dis(new_code, file=out)
        return (header + "# install the optional 'depyf' package for decompiled source; disassembly follows.\n"
                + "TRANSFORMED_BYTECODE = r'''\n" + out.getvalue() + "'''\n")
