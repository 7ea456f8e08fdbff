"""vgc's logging: one logger, `vgc`, whose lines read `vgc: ...` exactly once, however logging is set up.

Messages carry no prefix of their own. An application that configures logging (`logging.basicConfig`, its own
handlers, `TORCH_LOGS=vgc`) chooses the format, and `%(name)s` names vgc. Where nothing is configured, Python
would print a bare message through its last-resort handler; vgc's fallback handler prints it as `vgc: message`
instead, for warnings and errors only, like the last-resort handler.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("vgc")


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
