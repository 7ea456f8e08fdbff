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
import time
from pathlib import Path
from typing import Any

from vgc.capture import model_copy

logger = logging.getLogger("vgc")

PAYLOAD, RESULT, LOG = "payload.bin", "result.json", "child.log"


class BackgroundCompile:
    """One child process compiling `model` for `args`/`kwargs` with `options` (what `vgc.compile` was given);
    `entry` names the function the child runs, `"module:function"`, called with the directory."""

    def __init__(self, entry: str, model: Any, args: tuple, kwargs: dict, options: dict[str, Any]):
        payload = model_copy.dumps({"model": model, "args": args, "kwargs": kwargs, "options": options})
        self.directory = Path(tempfile.mkdtemp(prefix="vgc-background-compile-"))
        (self.directory / PAYLOAD).write_bytes(payload)
        module, function = entry.split(":")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        self.started = time.perf_counter()
        self.seconds: float | None = None
        with open(self.directory / LOG, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"import sys; from {module} import {function}; {function}(sys.argv[1])",
                 str(self.directory)], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        logger.info("tiered start: compiling in the background (process %d, %s)", self.process.pid, self.directory)

    def done(self) -> bool:
        if self.seconds is None and self.process.poll() is not None:
            self.seconds = time.perf_counter() - self.started
        return self.seconds is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the child to end (at most `timeout` seconds); whether it has."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return self.done()

    def result(self) -> dict[str, Any] | None:
        """What the child reported when it succeeded, else None."""
        if not self.done() or self.process.returncode != 0:
            return None
        try:
            return json.loads((self.directory / RESULT).read_text())
        except (OSError, ValueError):
            return None

    def failure(self) -> str:
        """Why the child did not succeed: its exit status and the end of its output."""
        try:
            tail = (self.directory / LOG).read_text(errors="replace").strip().splitlines()[-12:]
        except OSError:
            tail = []
        return f"exit status {self.process.returncode}" + (":\n  " + "\n  ".join(tail) if tail else "")

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def read_payload(directory: str) -> dict[str, Any]:
    """In the child: the model, call and options the serving process wrote."""
    return model_copy.loads((Path(directory) / PAYLOAD).read_bytes())


def write_result(directory: str, result: dict[str, Any]) -> None:
    (Path(directory) / RESULT).write_text(json.dumps(result))
