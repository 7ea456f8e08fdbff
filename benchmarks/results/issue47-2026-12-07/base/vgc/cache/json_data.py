"""JSON from files vgc did not necessarily write (a bundle's manifest, the files inside a bundle, index files under a
root), read as data: bounded in size and nesting before the parser sees it.

Python's JSON parser recurses once per nesting level, so a file of a few thousand `[` raises RecursionError
from inside it, and every walk over the result (comparing factors, flattening them) would recurse as deep again.
The depth is therefore measured first, without recursion and without parsing: brackets outside strings, summed
as +1 and -1 in C loops. A file over the limits is a `JsonLimitError`, a `ValueError` like any other JSON that
cannot be used, so every caller that handles bad JSON handles it too.
"""

from __future__ import annotations

import itertools
import json
import re
from array import array
from typing import Any

MAX_DEPTH = 64          # vgc's own files nest about 6 levels (a bundle manifest's factors), a user's options a few more
MAX_BYTES = 64 << 20    # a bundle manifest of about 350,000 files

# a JSON string, escapes included (the unrolled form: no backtracking per character)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# brackets to +1 / -1 as signed bytes; everything else deleted
_SIGNS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_OTHER = bytes(b for b in range(256) if b not in b"[{]}")


class JsonLimitError(ValueError):
    """JSON past the size or nesting limit: not a file vgc wrote."""


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in `data` (JSON text; for text that is not JSON, some number that
    the parser rejects anyway)."""
    signs = array("b", _STRING.sub(b"", data).translate(_SIGNS, _OTHER))
    return max(itertools.accumulate(signs), default=0)


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES, what: str = "the file"
          ) -> Any:
    """`json.loads(data)` once `data` is within `max_bytes` and nests at most `max_depth` levels; `JsonLimitError`
    (naming `what`) otherwise, `ValueError` for text that is not JSON."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise JsonLimitError(f"{what} is {len(data)} bytes, past the limit of {max_bytes} (vgc never writes one so "
                             "large)")
    depth = nesting_depth(data)
    if depth > max_depth:
        raise JsonLimitError(f"{what} nests {depth} levels deep, past the limit of {max_depth} (vgc never writes one "
                             "so deep)")
    return json.loads(data)
