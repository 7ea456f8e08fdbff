"""`vgc cache verify` on a real warm root with one fault applied at a time: each fault that changes what a start
does is named with exit status 1, harmless ones give 0, and a root that cannot be checked gives 2."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vgc.cache import recovery
from vgc.shells.verify import CannotVerify, verify_root
from vgc.cache.layout import ARTIFACT_DIR, CACHE_SUBDIR, INDEX_FILE, saved_trace_files_in
from vgc.shells.cli import main as vgc_main

WORKER = str(Path(__file__).parents[1] / "workers" / "cache_worker.py")


@pytest.fixture(scope="module")
def warm_root(tmp_path_factory):
    """A root written by one real compile of the tiny decoder, with Inductor's kernels in `<root>/inductor_cache`
    (the session's TORCHINDUCTOR_CACHE_DIR is dropped so that vgc puts them there, as in production)."""
    root = tmp_path_factory.mktemp("verify") / "root"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["VGC_CACHE_ROOT"] = str(root)
    proc = subprocess.run([sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert list(root.glob(f"{recovery.INDUCTOR_SUBDIR}/**/*.so")), "the fixture needs compiled C++ kernels"
    return root


@pytest.fixture
def copy(warm_root, tmp_path):
    dst = tmp_path / "root"
    shutil.copytree(warm_root, dst, symlinks=True)
    return dst


def rank_dir(root: Path) -> Path:
    (path,) = root.glob(f"{CACHE_SUBDIR}/*/rank_0_0")
    return path


def an_artifact(root: Path) -> Path:
    return sorted((rank_dir(root) / ARTIFACT_DIR).iterdir())[0]


def a_kernel(root: Path) -> Path:
    return sorted((root / recovery.INDUCTOR_SUBDIR).rglob("*.so"))[0]


def verify(capsys, root) -> tuple[int, str]:
    code = vgc_main(["cache", "verify", "--root", str(root)])
    out = capsys.readouterr().out
    assert "Traceback" not in out
    return code, out


def _replace_with_dir(path: Path) -> Path:
    if path.is_dir():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.mkdir()
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _truncate(path: Path) -> Path:
    return _write(path, path.read_bytes()[:100])


def _delete(path: Path) -> Path:
    path.unlink()
    return path


def _delete_tree(path: Path) -> Path:
    shutil.rmtree(path)
    return path


def _loop(path: Path) -> Path:
    os.symlink(path.name, path)
    return path


def _chmod(path: Path, mode: int) -> Path:
    path.chmod(mode)
    return path


# Each fault damages a copy of the warm root and returns the path that verify must name.
BAD_FAULTS = {
    "index-is-a-list": lambda r: _write(rank_dir(r) / INDEX_FILE, b"[]"),
    "index-wrong-schema": lambda r: _write(rank_dir(r) / INDEX_FILE, json.dumps({"x": {"format": "binary"}}).encode()),
    "index-garbage-bytes": lambda r: _write(rank_dir(r) / INDEX_FILE, b"\xff\xfe\x00garbage{"),
    "index-is-a-directory": lambda r: _replace_with_dir(rank_dir(r) / INDEX_FILE),
    "artifact-truncated": lambda r: _truncate(an_artifact(r)),
    "artifact-is-a-directory": lambda r: _replace_with_dir(an_artifact(r)),
    "artifact-deleted": lambda r: _delete(an_artifact(r)),
    "artifact-looping-symlink": lambda r: _loop(_delete(an_artifact(r))),
    "kernel-so-empty": lambda r: _write(a_kernel(r), b""),
    "kernel-so-garbage": lambda r: _write(a_kernel(r), b"not an ELF file"),
    "kernel-looping-symlink": lambda r: _loop(r / recovery.INDUCTOR_SUBDIR / "loop"),
    "lock-is-a-directory": lambda r: _replace_with_dir(rank_dir(r) / "locks" / "index.lock"),
    "lock-looping-symlink": lambda r: _loop(rank_dir(r) / "locks" / "piece-x.lock"),
    "locks-is-a-file": lambda r: _write(_delete_tree(rank_dir(r) / "locks"), b""),
    "factors-garbage": lambda r: _write(rank_dir(r) / "cache_key_factors.json", b"{not json"),
    "factors-without-hash": lambda r: _write(rank_dir(r) / "cache_key_factors.json", b"{}"),
    "root-writable-by-others": lambda r: _chmod(r, 0o777),
    "entry-writable-by-group": lambda r: _chmod(rank_dir(r).parent, 0o770),
    "inductor-cache-is-a-file": lambda r: _write(_delete_tree(r / recovery.INDUCTOR_SUBDIR), b""),
    # an FX-graph or AOTAutograd cache entry has no suffix that says "file", but only files go there (issue 51)
    "fxgraph-entry-is-a-directory": lambda r: _replace_with_dir(_inductor_entry(r, "fxgraph/*/*/*")),
    "aotautograd-entry-is-a-directory": lambda r: _replace_with_dir(_inductor_entry(r, "aotautograd/*/*")),
    "index-nested-5000-deep": lambda r: _write(rank_dir(r) / INDEX_FILE, b"[" * 5000 + b"]" * 5000),
    # a saved trace is bound to its entry: a copy in another entry (another config of the model) is caught
    "trace-copied-into-another-entry": lambda r: _trace_into_another_entry(r),
}


def _trace_into_another_entry(root: Path) -> Path:
    (trace,) = saved_trace_files_in(rank_dir(root))
    other = root / CACHE_SUBDIR / ("0" * 20) / "rank_0_0"
    other.mkdir(parents=True)
    shutil.copy(trace, other / trace.name)
    return other / trace.name


def _inductor_entry(root: Path, pattern: str) -> Path:
    return sorted(p for p in (root / recovery.INDUCTOR_SUBDIR).glob(pattern) if p.is_file())[0]


@pytest.mark.parametrize("fault", sorted(BAD_FAULTS))
def test_a_harmful_fault_is_named(copy, capsys, fault):
    bad_path = BAD_FAULTS[fault](copy)
    code, out = verify(capsys, copy)
    assert code == 1, out
    bad_lines = [line for line in out.splitlines() if line.startswith("BAD  ")]
    assert any(line.startswith(f"BAD  {bad_path}: ") for line in bad_lines), out
    assert out.splitlines()[-1].endswith(f", {len(bad_lines)} bad")
    assert bad_path in [path for path, _ in verify_root(copy)]


def test_malformed_record_is_named(copy, capsys):
    (rank_dir(copy) / INDEX_FILE).write_text(json.dumps({"x": {"format": "binary"}}))
    code, out = verify(capsys, copy)
    assert code == 1 and "record 'x' is malformed" in out, out


def test_an_unusable_index_is_one_line(copy, capsys):
    (rank_dir(copy) / INDEX_FILE).write_text("[]")
    code, out = verify(capsys, copy)
    # the artifacts it no longer names are not listed as unindexed: the one BAD line says why
    assert code == 1 and "unindexed" not in out and out.splitlines()[-1].endswith(", 1 bad"), out


HARMLESS_FAULTS = {
    "computation-graph-deleted": lambda r: _delete(rank_dir(r) / "computation_graph.py"),
    "transformed-code-garbage": lambda r: _write(rank_dir(r) / "transformed_code.py", b"\xff garbage"),
    "lock-content-garbage": lambda r: _write(rank_dir(r) / "locks" / "index.lock", b"\x00garbage"),
    "locks-dir-deleted": lambda r: _delete_tree(rank_dir(r) / "locks"),
    "inductor-cache-deleted": lambda r: _delete_tree(r / recovery.INDUCTOR_SUBDIR),
}


@pytest.mark.parametrize("fault", sorted(HARMLESS_FAULTS))
def test_a_harmless_change_passes(copy, capsys, fault):
    HARMLESS_FAULTS[fault](copy)
    code, out = verify(capsys, copy)
    assert code == 0 and "BAD" not in out and out.rstrip().endswith(", 0 bad"), out


def test_clean_root_passes_and_changes_nothing(warm_root, capsys):
    before = sorted(str(p.relative_to(warm_root)) for p in warm_root.rglob("*"))
    code, out = verify(capsys, warm_root)
    assert code == 0, out
    count = len(json.loads((rank_dir(warm_root) / INDEX_FILE).read_text()))
    assert out.splitlines()[-1] == f"{count} artifacts in 1 entries checked, 0 bad"
    assert verify_root(warm_root) == []
    assert sorted(str(p.relative_to(warm_root)) for p in warm_root.rglob("*")) == before


def test_an_unindexed_artifact_is_info_only(copy, capsys):
    artifact = an_artifact(copy)
    extra = artifact.with_name("piece-0-old.bin")
    shutil.copy(artifact, extra)
    code, out = verify(capsys, copy)
    assert code == 0 and f"info {extra}: unindexed" in out and "BAD" not in out, out


@pytest.mark.parametrize("make", ["missing", "file", "loop"])
def test_a_root_that_cannot_be_checked(tmp_path, capsys, make):
    root = tmp_path / "root"
    if make == "file":
        root.write_text("x")
    elif make == "loop":
        os.symlink(root.name, root)
    code, out = verify(capsys, root)
    assert code == 2 and out.startswith(f"vgc cache verify: cannot check {root}: "), out
    with pytest.raises(CannotVerify):
        verify_root(root)


def test_verify_failing_itself_is_status_2(copy, capsys, monkeypatch):
    def boom(root, deep=False):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(recovery, "kernel_cache_problems", boom)
    code, out = verify(capsys, copy)
    assert code == 2 and "cannot check" in out and "RuntimeError: simulated failure" in out, out


@pytest.mark.parametrize("name", ["x86_isa_help.so.load_ok", "kernel.lock", "__init__.py"])
def test_files_inductor_leaves_empty_on_purpose_are_not_damage(tmp_path, name):
    # torch 2.14 marks an ISA probe that loaded with an empty '<library>.so.load_ok' beside it
    kernels = tmp_path / recovery.INDUCTOR_SUBDIR / "ab"
    kernels.mkdir(parents=True)
    (kernels / name).write_bytes(b"")
    (kernels / "cut.so").write_bytes(b"")
    assert [(p.name, why) for p, why in recovery.kernel_cache_problems(tmp_path)] == \
        [("cut.so", "empty file (a write that was interrupted)")]


def test_autotuning_results_inductor_rewrites_in_place_are_not_checked_against_a_record(tmp_path):
    """Triton's `.best_config` files are rewritten as more sizes are tuned: on an H100 all four of a warm root's
    had changed after they were recorded, and every start removed them as swapped. They are not recorded, and a
    record an older vgc wrote for one is ignored; a kernel beside them still is checked."""
    from vgc.cache import kernel_hashes

    kernels = tmp_path / recovery.INDUCTOR_SUBDIR
    rank = tmp_path / "torch_compile_cache" / "e" / "rank_0_0"
    (kernels / "ab").mkdir(parents=True)
    rank.mkdir(parents=True)
    tuned, kernel = kernels / "ab" / "0123.best_config", kernels / "ab" / "k.main.so"
    tuned.write_text('{"XBLOCK": 64}')
    kernel.write_bytes(b"\x7fELF one")
    kernel_hashes.update(rank, kernels)
    assert set(json.loads((rank / kernel_hashes.RECORD_FILE).read_text())) == {"ab/k.main.so"}
    record = json.loads((rank / kernel_hashes.RECORD_FILE).read_text())
    record["ab/0123.best_config"] = "0" * 64   # as the vgc before this wrote it
    (rank / kernel_hashes.RECORD_FILE).write_text(json.dumps(record))
    tuned.write_text('{"XBLOCK": 128}')
    assert kernel_hashes.mismatches(tmp_path, kernels, once=False) == []
    kernel.write_bytes(b"\x7fELF two")
    assert [p.name for p, _ in kernel_hashes.mismatches(tmp_path, kernels, once=False)] == ["k.main.so"]


def test_a_missing_index_is_named_as_the_index_when_its_artifacts_load(copy, caplog):
    """Without index.json a start compiles every artifact again; the warning names the index, not an artifact."""
    import logging

    from vgc import log
    from vgc.cache.store import ArtifactStore

    index = rank_dir(copy) / INDEX_FILE
    name = sorted(json.loads(index.read_text()))[0]
    index.unlink()
    log._warned.clear()
    with caplog.at_level(logging.WARNING, logger="vgc"):
        assert ArtifactStore(rank_dir(copy), "binary").load(name) is None   # a miss: nothing to check it against
    (warning,) = [r.getMessage() for r in caplog.records]
    assert f"cache index {index} is missing" in warning and "compiled again" in warning, warning


def test_an_index_swapped_in_is_named_with_the_artifacts_it_fails(copy, capsys):
    """Issue 51: an index from elsewhere made intact artifacts read as "unusable (content hash mismatch)"; the
    message now says the hash is the index's record, which may be the part that changed."""
    index = rank_dir(copy) / INDEX_FILE
    records = json.loads(index.read_text())
    first, second = sorted(records)[:2]
    records[first]["sha256"], records[second]["sha256"] = records[second]["sha256"], records[first]["sha256"]
    index.write_text(json.dumps(records))
    code, out = verify(capsys, copy)
    assert code == 1 and out.count("content hash differs from the one recorded in index.json (the file or the "
                                   "index changed)") == 2, out


# ---- an index swapped between two entries (issue 51) ----
class _Saved:
    """A stand-in for a compiled artifact: its text is what it computes."""

    def __init__(self, text: str):
        self.text = text


@pytest.fixture
def two_entries(tmp_path, monkeypatch):
    """(root, stores): two entries' rank directories, each with two artifacts of the same names saved through the
    real store (the artifact files are stand-ins written and read by the patched save and load)."""
    from vgc import _compat, log
    from vgc.cache.store import ArtifactStore

    monkeypatch.setattr(_compat, "save_artifact", lambda artifact, path, fmt: Path(path).write_text(artifact.text))
    monkeypatch.setattr(_compat, "load_artifact", lambda path, fmt, extern_kernels=None: _Saved(Path(path).read_text()))
    log._warned.clear()
    stores = {}
    for entry in ("a" * 20, "b" * 20):
        store = ArtifactStore(tmp_path / CACHE_SUBDIR / entry / "rank_0_0", "binary")
        for piece in ("piece-1", "piece-2"):
            store.load_or_compile(piece, lambda: _Saved(f"{piece} of {entry}"), {})
        stores[entry] = store
    return tmp_path, stores


def _swap_indexes(stores) -> None:
    first, second = (s.directory / INDEX_FILE for s in stores.values())
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)


def test_an_index_swapped_between_entries_is_one_warning_a_miss_and_a_rebuilt_index(two_entries, caplog):
    """Issue 51: an index swapped in from another entry made every intact artifact read as "unusable (content hash
    differs)", one warning each, and its records stayed. Now each record names the entry and rank it was written
    for: the start warns once, naming the index and the entry it belongs to, counts it as damage once, compiles
    the artifacts (never loads the other entry's) and writes an index of its own."""
    import logging

    from vgc import log
    from vgc.cache.store import ArtifactStore

    root, stores = two_entries
    _swap_indexes(stores)
    log._warned.clear()
    directory = stores["a" * 20].directory
    store = ArtifactStore(directory, "binary")   # a new process's view of the entry
    with caplog.at_level(logging.WARNING, logger="vgc"):
        got = [store.load_or_compile(p, lambda p=p: _Saved(f"{p} of {'a' * 20}, compiled again"), {})
               for p in ("piece-1", "piece-2")]
    assert [f.artifact.text for f in got] == [f"piece-{i} of {'a' * 20}, compiled again" for i in (1, 2)]
    assert [f.counts for f in got] == [{"cache_corrupt": 1, "cache_misses": 1, "inductor_compiles": 1,
                                        "artifacts_saved": 1},
                                       {"cache_misses": 1, "inductor_compiles": 1, "artifacts_saved": 1}]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert f"cache index {directory / INDEX_FILE} was written for {'b' * 20}/rank_0_0, not for {'a' * 20}/rank_0_0" \
        in warning and "compiled again" in warning, warning
    index = json.loads((directory / INDEX_FILE).read_text())
    assert sorted(index) == ["piece-1", "piece-2"] and {r["entry"] for r in index.values()} == {f"{'a' * 20}/rank_0_0"}
    log._warned.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vgc"):   # the next start loads its own artifacts, quietly
        again = ArtifactStore(directory, "binary").load("piece-1")
    assert again.artifact.text == f"piece-1 of {'a' * 20}, compiled again" and caplog.records == []


def test_verify_names_an_index_swapped_between_entries_once(two_entries, capsys):
    root, stores = two_entries
    assert verify_root(root) == []
    _swap_indexes(stores)
    code, out = verify(capsys, root)
    bad = [line for line in out.splitlines() if line.startswith("BAD")]
    assert code == 1 and len(bad) == 2, out   # one line per index, none per artifact
    for mine, other in (("a" * 20, "b" * 20), ("b" * 20, "a" * 20)):
        assert any(f"{mine}/rank_0_0/index.json: written for {other}/rank_0_0, not for {mine}/rank_0_0" in line
                   for line in bad), out
    assert "unindexed" not in out and "content hash" not in out, out
