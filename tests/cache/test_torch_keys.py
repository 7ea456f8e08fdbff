"""The hashes of torch's sources (Inductor's) and of Triton's compiler (Triton's) are remembered under the cache
root, by a signature of those files, and handed to the next process (which then reads none of them to hash them); a
damaged record is computed again."""

import json
import os
import subprocess
import sys

import pytest

from vgc.cache import keys

# A fresh process: the entry key of a config (what every start computes), then Inductor's own torch hash.
PROBE = """
import json, sys, vgc
from torch._inductor import codecache
from vgc.cache import keys
hashed = []
original = codecache.build_code_hash
codecache.build_code_hash = lambda *a: (hashed.append(1), original(*a))[1]
from vgc.cache.entry import entry_key
entry_key(vgc.CompilationConfig(), "cpu", [])
print(json.dumps({"torch_key": codecache.torch_key().hex(), "read_torch_files": bool(hashed)}))
"""


def probe(root) -> dict:
    env = {**os.environ, "VGC_CACHE_ROOT": str(root)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def records(root):
    return sorted((root / keys.TORCH_KEYS_DIR).iterdir())


def test_the_hash_is_remembered_handed_to_inductor_and_a_damaged_record_is_computed_again(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    first = probe(root)
    assert first["read_torch_files"]
    [record] = records(root)
    assert record.read_text().split()[0] == first["torch_key"]

    second = probe(root)   # remembered: Inductor is handed the value, no torch module is read to hash it
    assert second == {"torch_key": first["torch_key"], "read_torch_files": False}

    # A record whose check fails (one hex digit changed) is not taken for a hash: computed again, rewritten.
    text = record.read_text()
    record.write_text(("0" if text[0] != "0" else "1") + text[1:])
    third = probe(root)
    assert third == {"torch_key": first["torch_key"], "read_torch_files": True}
    assert record.read_text() == text
    for garbage in (b"", b"\xff\xfe", b"zz 12", b"ab" * 40):
        record.write_bytes(garbage)
        assert probe(root) == third
        assert record.read_text() == text


def test_a_root_that_cannot_hold_the_records_computes_the_hashes_each_time(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / keys.TORCH_KEYS_DIR).write_text("a file where the records' directory goes")   # refuses writes, as root too
    assert probe(root)["read_torch_files"] and probe(root)["read_torch_files"]
    assert (root / keys.TORCH_KEYS_DIR).read_text() == "a file where the records' directory goes"
    try:
        import triton  # noqa: F401
    except ImportError:
        return
    (root / keys.TRITON_KEYS_DIR).write_text("a file where the records' directory goes")
    assert triton_probe(root)["read_triton_files"] and triton_probe(root)["read_triton_files"]
    assert (root / keys.TRITON_KEYS_DIR).read_text() == "a file where the records' directory goes"


def test_the_signature_follows_every_module_file(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.so").write_bytes(b"\0" * 8)
    (package / "notes.txt").write_text("not a module")
    before = keys._files_signature(str(package))
    (package / "notes.txt").write_text("still not a module, longer")
    assert keys._files_signature(str(package)) == before
    (package / "a.py").write_text("x = 22\n")     # another size
    edited = keys._files_signature(str(package))
    assert edited != before
    os.utime(package / "sub" / "b.so", ns=(1, 1))   # same size, another time
    assert keys._files_signature(str(package)) != edited
    (package / "c.py").write_text("")
    assert len({before, edited, keys._files_signature(str(package))}) == 3


# A fresh process: Triton's hash answered from the record under the root given, then read from Triton's module
# (where Triton's compile reads it), from a module of Triton's that imported it by name before, and from torch's
# module that imports it after.
TRITON_PROBE = """
import json, pathlib, sys
import triton.runtime.autotuner, triton.runtime.cache as triton_cache
original = triton_cache.triton_key
from vgc.cache import keys
keys.remember_triton_key(pathlib.Path(sys.argv[1]))
from torch._inductor.runtime import triton_compat
answers = [triton_cache.triton_key(), triton.runtime.autotuner.triton_key(), triton_compat.triton_key()]
print(json.dumps({"keys": answers, "read_triton_files": original.cache_info().currsize > 0}))
"""


def triton_probe(root) -> dict:
    out = subprocess.run([sys.executable, "-c", TRITON_PROBE, str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tritons_hash_is_remembered_answered_everywhere_and_a_damaged_record_is_computed_again(tmp_path):
    """Without Triton (CI's CPU wheel) there is nothing to remember; this runs where Triton is installed."""
    pytest.importorskip("triton")
    from triton.runtime.cache import triton_key

    root = tmp_path / "root"
    root.mkdir()
    first = triton_probe(root)
    assert first["read_triton_files"] and first["keys"] == [triton_key()] * 3
    [record] = sorted((root / keys.TRITON_KEYS_DIR).iterdir())
    assert record.read_text().split()[0] == triton_key()

    assert triton_probe(root) == {"keys": first["keys"], "read_triton_files": False}   # nothing of Triton's read

    text = record.read_text()
    for damaged in (text.replace("-", "+", 1), "", "3.0 1234", "\xff" + text):   # one character changed, garbage
        record.write_text(damaged)
        assert triton_probe(root) == first
        assert record.read_text() == text


def test_a_cold_start_records_both_hashes_once_its_root_exists(tmp_path):
    """A cold start looks its trace up before the root exists (nothing is recorded then), so the store it opens to
    save records the hashes; the first warm process reads neither torch's nor (where installed) Triton's files to
    hash them."""
    root = tmp_path / "new-root"
    opened = subprocess.run(
        [sys.executable, "-c", "import vgc; from vgc.cache.entry import open_store; "
         "print(type(open_store(vgc.CompilationConfig(), 'cuda', [], key=('0' * 16, {}))).__name__)"],
        env={**os.environ, "VGC_CACHE_ROOT": str(root)}, capture_output=True, text=True, timeout=300)
    assert opened.stdout.split() == ["ArtifactStore"], opened.stderr[-3000:]
    assert probe(root)["read_torch_files"] is False
    try:
        import triton  # noqa: F401
    except ImportError:
        return
    assert triton_probe(root)["read_triton_files"] is False


# A fresh process: a tiered start's head start under the root given, waited for as its first call waits, then to
# its end (its torch part is not waited for by a call).
HEAD_START = """
import json, pathlib, sys, threading, vgc
from vgc.background_compile import HeadStart
from vgc.cache.entry import records_root
root = records_root(vgc.CompilationConfig(cache_dir=sys.argv[1]))
head = HeadStart(root, "cuda")
head.wait()
waited = [t.is_alive() for t in head._needed]
for thread in threading.enumerate():
    if thread.name == "vgc-head-start":
        thread.join()
print(json.dumps({"root": None if root is None else str(root), "still_needed": waited}))
"""


def head_start(root) -> dict:
    out = subprocess.run([sys.executable, "-c", HEAD_START, str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_tiered_start_records_both_hashes_for_its_child_before_any_store_opens(tmp_path):
    """The serving process of a tiered start records them in threads while its child imports torch, so the child
    (and every later process) reads neither torch's nor (where installed) Triton's files to hash them. Its first
    call waits for Triton's part only: after `wait()` nothing it needs is still running."""
    root = tmp_path / "new-root"
    assert head_start(root) == {"root": str(root), "still_needed": []}
    assert probe(root)["read_torch_files"] is False
    try:
        import triton  # noqa: F401
    except ImportError:
        return
    assert triton_probe(root)["read_triton_files"] is False


def test_a_head_start_writes_nothing_under_an_untrusted_root_and_survives_one_that_refuses_writes(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)   # anyone could plant a record there: the child would not load from it either
    assert head_start(shared) == {"root": None, "still_needed": []}
    assert list(shared.iterdir()) == []
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / keys.TORCH_KEYS_DIR).write_text("a file where the records' directory goes")
    (blocked / keys.TRITON_KEYS_DIR).write_text("a file where the records' directory goes")
    assert head_start(blocked) == {"root": str(blocked), "still_needed": []}
    assert sorted(p.name for p in blocked.iterdir()) == sorted([keys.TORCH_KEYS_DIR, keys.TRITON_KEYS_DIR])
