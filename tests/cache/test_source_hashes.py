"""Source hashes remembered per installation (`vgc/cache/source_hashes.py`): the memo's signature follows every
file a hash reads, a damaged memo is never believed, a torch that cannot take a hash computes it, and a later
process takes the right torch key (`tests/cache/test_cache.py` checks that one: its artifacts load, which they
would not under a wrong key). Triton's key is remembered on CUDA machines only; its preset is checked here."""

import functools
import os

import torch
import torch._inductor.codecache as codecache
import torch.utils._triton as torch_triton

from vgc import _compat
from vgc.cache import source_hashes as torch_key
from vgc.cache.layout import SOURCE_HASH_DIR


def test_the_signature_follows_every_hashed_file_and_nothing_else(tmp_path):
    package = tmp_path / "torch"
    (package / "sub").mkdir(parents=True)
    (package / "include").mkdir()
    source, extension, extra = package / "sub" / "a.py", package / "_C.so", tmp_path / "script.ld"
    for path in (source, extension, extra, package / "sub" / "__init__.py"):
        path.write_text("x = 1\n")
    before = torch_key.installation_signature(str(package), [str(extra)])
    # not read by the key: other files, and directories that are not packages (headers, libraries)
    (package / "notes.txt").write_text("not hashed")
    (package / "include" / "gen.py").write_text("not a module of torch")
    assert torch_key.installation_signature(str(package), [str(extra)]) == before

    signatures = {before}
    for path, change in ((source, "x = 22\n"), (extension, "y"), (extra, "z")):
        path.write_text(change)
        signatures.add(torch_key.installation_signature(str(package), [str(extra)]))
    stamp = os.stat(source).st_mtime_ns
    os.utime(source, ns=(stamp, stamp + 1_000_000))   # same size, touched
    signatures.add(torch_key.installation_signature(str(package), [str(extra)]))
    (package / "sub" / "b.py").write_text("")
    signatures.add(torch_key.installation_signature(str(package), [str(extra)]))
    extra.unlink()
    signatures.add(torch_key.installation_signature(str(package), [str(extra)]))
    assert len(signatures) == 7


def test_a_damaged_memo_is_not_believed_and_is_written_again(tmp_path):
    key = _compat.torch_key()
    assert torch_key._decode(torch_key._encode(key)) == key
    text = torch_key._encode(key)
    flipped = text[:5] + (b"0" if text[5:6] != b"0" else b"1") + text[6:]
    for damaged in (flipped, text[:20], b"", b"\xff\xfe", b"zz " + text.split()[1], text.replace(b" ", b"")):
        assert torch_key._decode(damaged) is None, damaged

    package_dir, extra_files = _compat.torch_key_hashed_files()
    memo = tmp_path / SOURCE_HASH_DIR / f"torch-{torch_key.installation_signature(package_dir, extra_files)}"
    memo.parent.mkdir()
    memo.write_bytes(flipped)
    # this process already knows its key, so nothing is preset; the damaged memo is replaced by the true key
    assert torch_key.remember_torch_key.__wrapped__(tmp_path) is False
    assert torch_key._decode(memo.read_bytes()) == key


def test_a_torch_whose_key_cannot_be_set_computes_it(monkeypatch):
    computed = []

    def plain_key():   # a functools.cache-style key: no set()
        computed.append(1)
        return b"k" * 32

    monkeypatch.setattr(codecache, "torch_key", plain_key)
    assert _compat.preset_torch_key(b"x" * 32) is False
    assert _compat.torch_key() == b"k" * 32 and computed == [1]


def test_triton_s_key_is_preset_only_where_it_was_not_computed(monkeypatch, tmp_path):
    @functools.cache
    def fresh() -> str:
        raise AssertionError("computed, not preset")

    monkeypatch.setattr(torch_triton, "triton_hash_with_backend", fresh)
    assert _compat.preset_triton_hash("ABC") is True
    assert torch_triton.triton_hash_with_backend() == "ABC"
    assert _compat.preset_triton_hash("DEF") is False   # this process knows its own now
    assert torch_triton.triton_hash_with_backend() == "ABC"
    monkeypatch.setattr(torch_triton, "triton_hash_with_backend", lambda: "plain")   # no cache: cannot take one
    assert _compat.preset_triton_hash("ABC") is False
    if not torch.cuda.is_available():   # no GPU: Triton's backend hash is not needed, nor remembered
        assert torch_key.remember_triton_key.__wrapped__(tmp_path) is False
        assert not (tmp_path / SOURCE_HASH_DIR).exists()


def test_the_whole_package_signature_follows_every_file(tmp_path):
    package = tmp_path / "triton"
    (package / "_C").mkdir(parents=True)
    library = package / "_C" / "libtriton.so"
    library.write_bytes(b"x")
    before = torch_key.installation_signature(str(package), [], packages_only=False, facts="(9, 0)")
    assert torch_key.installation_signature(str(package), [], packages_only=False, facts="(8, 0)") != before
    library.write_bytes(b"xy")
    assert torch_key.installation_signature(str(package), [], packages_only=False, facts="(9, 0)") != before
