"""vgc's logging: one logger, `vgc`, whose lines read `vgc: ...` exactly once, however logging is set up.

Messages carry no prefix of their own. An application that configures logging (`logging.basicConfig`, its own
handlers, `TORCH_LOGS=vgc`) chooses the format, and `%(name)s` names vgc. Where nothing is configured, Python
would print a bare message through its last-resort handler; vgc's fallback handler prints it as `vgc: message`
instead, for warnings and errors only, like the last-resort handler.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading

from tqdm import tqdm

logger = logging.getLogger("vgc")

PROGRESS_DELAY_S = 2.0   # work that finishes faster than this shows no bar


class _FallbackHandler(logging.StreamHandler):
    """Writes a record only when no other handler would: neither the `vgc` logger nor the root logger has one."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("vgc: %(message)s"))
        self.setLevel(logging.WARNING)

    @property
    def stream(self):   # the current stderr, so pytest's capture and redirections see it
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(h is not self for h in logger.handlers):
            return
        super().emit(record)


def install_fallback_handler() -> None:
    if not any(isinstance(h, _FallbackHandler) for h in logger.handlers):
        logger.addHandler(_FallbackHandler())


def _progress_disabled() -> bool | None:
    """Whether to hide a progress bar: never with INFO on for vgc; always when vgc's logger is set quieter; with
    default logging, unless stderr is a terminal (tqdm's None): a newcomer sees a long cold compile move, while
    services and CI logs get no carriage-return noise."""
    if logger.isEnabledFor(logging.INFO):
        return False
    return True if logger.level > logging.INFO else None


@contextlib.contextmanager
def progress(total: int, desc: str, *, unit: str):
    """A bar (on stderr) that appears once the work has taken `PROGRESS_DELAY_S`: one step (an Inductor compile,
    a graph capture) may take many seconds with nothing to update, so a thread shows the bar then, and on a
    terminal keeps its clock ticking (in a log file each refresh would be another copy)."""
    bar = tqdm(total=total, desc=desc, unit=unit, delay=PROGRESS_DELAY_S, leave=False, disable=_progress_disabled())
    done = threading.Event()
    terminal = getattr(sys.stderr, "isatty", lambda: False)()

    def tick():
        if done.wait(PROGRESS_DELAY_S):
            return
        bar.refresh()
        while terminal and not done.wait(1.0):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="vgc-progress", daemon=True)
    if not bar.disable:
        ticker.start()
    try:
        yield bar
    finally:
        done.set()
        if ticker.is_alive():
            ticker.join()
        bar.close()


_warned: set[str] = set()


def warn_once(key: str, message: str, *args) -> None:
    """One warning per problem per process: a damaged file is reported once, not at every piece."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)
