"""The compile of a tiered start, in a process of its own: a model and its first call written to a directory
(`vgc.capture.model_copy`: shapes, not weights), a child process that traces, compiles and saves them to the
compile cache, and what the serving process asks of it (`done`, `succeeded`, why it failed).

A separate process, not a thread: Dynamo and Inductor are Python, and a thread would hold the serving process's
interpreter for most of the compile. The child inherits the environment (the cache root among it) and the serving
process's import path, so it finds the model's code and the cache where the server will load from.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vgc import _compat
from vgc.cache.keys import remember_torch_build_key, remember_triton_key
from vgc.cache.layout import atomic_write
from vgc.capture import model_copy

logger = logging.getLogger("vgc")

PAYLOAD, RESULT, LOG = "payload.bin", "result.json", "child.log"
_UNREAD = object()


class BackgroundCompile:
    """One child process compiling `model` for `args`/`kwargs` with `options` (what `vgc.compile` was given);
    `entry` names the function the child runs, `"module:function"`, called with the directory."""

    def __init__(self, entry: str, model: Any, args: tuple, kwargs: dict, options: dict[str, Any]):
        payload = model_copy.dumps({"model": model, "args": args, "kwargs": kwargs, "options": options})
        self.directory = Path(tempfile.mkdtemp(prefix="vgc-background-compile-"))
        (self.directory / PAYLOAD).write_bytes(payload)
        module, function = entry.split(":")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        self.started, self.spawned_at = time.perf_counter(), time.time()
        self.seconds: float | None = None
        self._report: Any = _UNREAD
        self._unreadable = ""   # why a report the child left could not be taken
        with open(self.directory / LOG, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"import sys; from {module} import {function}; {function}(sys.argv[1])",
                 str(self.directory)], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        logger.info("tiered start: compiling in the background (process %d, %s)", self.process.pid, self.directory)

    def done(self) -> bool:
        """Whether the child has reported its result (its last act, after the cache holds everything) or ended. Its
        interpreter's shutdown that follows (Inductor's compile workers, CUDA; 0.9 s on a 2-core CPU) is not waited
        for."""
        if self.seconds is None and ((self.directory / RESULT).exists() or self.process.poll() is not None):
            self.seconds = time.perf_counter() - self.started
        return self.seconds is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the child's result or its end (at most `timeout` seconds); whether either came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            try:
                self.process.wait(0.05)
            except subprocess.TimeoutExpired:
                pass
        return True

    def result(self) -> dict[str, Any] | None:
        """What the child reported when it succeeded, else None. A report is written whole after the compile and
        its saves (`write_result`), so it stands even if the child's shutdown fails after it. Read once: the
        child writes nothing after it."""
        if not self.done():
            return None
        if self._report is _UNREAD:
            self._report, self._unreadable = _read_report(self.directory / RESULT)
        return self._report

    def phases(self) -> dict[str, float]:
        """Where the child's time went, in seconds: `import` (from its spawn to its entry function: the interpreter,
        torch and vgc), `read_payload`, then its compile's own phases (`trace`, `compile_or_load`, ...)."""
        result = self.result() or {}
        phases = {"import": result["entered"] - self.spawned_at} if _is_number(result.get("entered")) else {}
        seconds = result.get("seconds")
        phases.update({k: v for k, v in seconds.items() if _is_number(v)} if isinstance(seconds, dict) else {})
        return phases

    def failure(self) -> str:
        """Why the child did not succeed: a report it left that cannot be read, its exit status and the end of its
        output."""
        self.result()
        try:
            tail = (self.directory / LOG).read_text(errors="replace").strip().splitlines()[-12:]
        except OSError:
            tail = []
        status = "still running" if self.process.poll() is None else f"exit status {self.process.returncode}"
        return (f"{self._unreadable}; {status}" if self._unreadable else status) + \
            (":\n  " + "\n  ".join(tail) if tail else "")

    def cleanup(self) -> None:
        if self.process.poll() is None:   # still compiling, or past its report and shutting down: nothing to lose
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


class HeadStart:
    """What the serving process's first call and the child's compile both wait on, begun in threads of the serving
    process while the child imports torch (about 2.4 s on an H100 host): on a GPU, Triton's driver (with Triton's
    cache empty, a build of its C utilities) and Triton's hash of its library, each about 0.4 s there, spent on a
    compiler's subprocess and in hashing, outside the interpreter's lock; then, under `root`, both hashes and
    torch's recorded, for the child to read instead of computing them. The first call waits for Triton's two
    (`wait`), which it needs anyway; torch's is the child's alone. A step that fails costs only its head start."""

    def __init__(self, root: Path | None, device_type: str):
        self._needed: list[threading.Thread] = []
        if device_type == "cuda":
            self._needed.append(_begin(_compat.start_triton_driver))
            self._needed.append(_begin(_compat.triton_source_key if root is None else
                                       lambda: remember_triton_key(root)))
        if root is not None:
            _begin(lambda: remember_torch_build_key(root))

    def wait(self, timeout: float = 60.0) -> None:
        """Until the first call's part is done, or `timeout` seconds (the call then does what is left itself)."""
        deadline = time.monotonic() + timeout
        for thread in self._needed:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._needed = [t for t in self._needed if t.is_alive()]


def _begin(step) -> threading.Thread:
    def run():
        try:
            step()
        except Exception as e:   # noqa: BLE001 - the step is done again where it is needed, and fails there
            logger.debug("tiered start: %s failed ahead of its use (%s: %s)", getattr(step, "__name__", step),
                         type(e).__name__, e)
    thread = threading.Thread(target=run, name="vgc-head-start", daemon=True)
    thread.start()
    return thread


def _read_report(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the child's report, "") or (None, why it cannot be taken); (None, "") when there is none."""
    try:
        report = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"its report {path} could not be read ({type(e).__name__}: {e})"
    except ValueError as e:   # JSON's errors and undecodable bytes: damaged from outside, never half-written
        return None, f"its report {path} is damaged ({type(e).__name__}: {e})"
    if not isinstance(report, dict):
        return None, f"its report {path} is not one vgc's child writes (a JSON {type(report).__name__})"
    return report, ""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_payload(directory: str) -> dict[str, Any]:
    """In the child: the model, call and options the serving process wrote."""
    return model_copy.loads((Path(directory) / PAYLOAD).read_bytes())


def write_result(directory: str, result: dict[str, Any]) -> None:
    """In the child, its last act: the serving process takes the file's existence for the compile's end, so it is
    written whole or not at all."""
    atomic_write(Path(directory) / RESULT, json.dumps(result).encode())
