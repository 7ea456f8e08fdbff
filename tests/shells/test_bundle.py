"""One-file cache bundles (`vgc cache pack` / `unpack`): reproducible, relocatable (another root, HOME, TMPDIR and
XDG_CACHE_HOME in a fresh process: 0 Inductor calls, outputs equal to the packing process's), and every damaged
or foreign bundle refused with its reason, installing nothing."""

import copy
import hashlib
import io
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from vgc.shells import bundle as bundles
from vgc.shells import bundle_check
from vgc.cache import cpu_isa, inventory
from vgc.cache.layout import CACHE_SUBDIR, FACTORS_FILE
from vgc.shells.cli import main as vgc_main
from conftest import mount_tmpfs

WORKER = str(Path(__file__).parents[1] / "workers" / "warm_worker.py")


def run_worker(root: Path, outputs: Path, **env) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}   # vgc's, under the root
    environment.update(VGC_CACHE_ROOT=str(root), **env)
    proc = subprocess.run([sys.executable, WORKER, "--outputs", str(outputs)], env=environment, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(root, bundle, outputs): the tiny decoder compiled once in a fresh process, its root packed."""
    base = tmp_path_factory.mktemp("bundle")
    root, outputs = base / "root", base / "outputs.pt"
    report = run_worker(root, outputs)
    assert report["trace_source"] == "traced" and report["counters"]["inductor_compiles"] > 0
    assert vgc_main(["cache", "--root", str(root), "pack", "-o", str(base / "tiny.vgcb")]) == 0
    return root, base / "tiny.vgcb", outputs


def test_packing_is_reproducible_and_a_bundle_shows_and_verifies(packed, tmp_path, capsys):
    root, bundle, _ = packed
    again = tmp_path / "again.vgcb"
    record = root / "inductor_cache" / cpu_isa.MARKER_DIR / "0123abcd"   # torch < 2.13's ISA record: this machine's
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("loaded\n")
    assert vgc_main(["cache", "--root", str(root), "pack", "-o", str(again)]) == 0
    assert again.read_bytes() == bundle.read_bytes()
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile(names[0]).read())
    assert names[0] == "manifest.json" and sorted(names[1:]) == sorted(manifest["files"])
    assert not [n for n in names if "/locks/" in n or n.endswith((".lock", ".tmp")) or ".vgc-loads-" in n]
    assert any(n.startswith("inductor_cache/") for n in names)   # the kernels travel with the entry
    (entry,) = manifest["entries"].values()
    environment = entry["factors"]["environment"]
    assert {"torch_version", "python", "vgc_version", "world_size", "cpu_vec_isa"} <= set(environment)
    assert entry["ranks"] == ["rank_0_0"]
    capsys.readouterr()
    assert vgc_main(["cache", "show", str(bundle)]) == 0
    assert f"entry {next(iter(manifest['entries']))}, ranks rank_0_0" in capsys.readouterr().out
    assert vgc_main(["cache", "verify", str(bundle)]) == 0
    assert "0 problems; it can be unpacked here" in capsys.readouterr().out


def test_pack_onto_a_directory_is_refused_and_removes_nothing(packed, tmp_path, capsys):
    """`-o` naming a directory (a typo, or `-o .`) must not replace it: its files are the user's."""
    root, _, _ = packed
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "thesis.txt").write_text("x")
    assert vgc_main(["cache", "--root", str(root), "pack", "-o", str(keep)]) == 2
    assert "names a directory; give a file name" in capsys.readouterr().out
    assert (keep / "thesis.txt").read_text() == "x"


def test_a_bundle_unpacked_under_another_root_and_environment_loads_without_compiling(packed, tmp_path):
    _, bundle, outputs = packed
    root = tmp_path / "elsewhere" / "cache"
    assert vgc_main(["cache", "--root", str(root), "unpack", str(bundle)]) == 0
    home, scratch = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    report = run_worker(root, tmp_path / "outputs.pt", HOME=str(home), TMPDIR=str(scratch),
                        XDG_CACHE_HOME=str(home / "xdg"))
    assert report["trace_source"] == "saved" and report["warnings"] == []
    assert report["counters"]["inductor_compiles"] == 0 and report["counters"]["dynamo_traces"] == 0
    want, got = torch.load(outputs), torch.load(tmp_path / "outputs.pt")
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)


def test_unpack_keeps_an_intact_entry_and_replaces_a_damaged_one(packed, tmp_path, capsys):
    _, bundle, _ = packed
    root = tmp_path / "root"
    assert bundles.unpack(bundle, root) == {h: "installed" for h in bundles.check(bundle).entries}
    assert set(bundles.unpack(bundle, root).values()) == {"kept"}
    (entry,) = inventory.entries(root)
    (index,) = entry.path.glob("rank_*/index.json")
    index.write_text("{not json")
    assert set(bundles.unpack(bundle, root).values()) == {"replaced"}
    assert vgc_main(["cache", "--root", str(root), "verify"]) == 0
    assert not [p for p in root.iterdir() if p.name.startswith(".vgc-")]   # no staging left behind


# ---- damaged and foreign bundles ----
def _members(bundle: Path) -> tuple[dict, list[tuple[tarfile.TarInfo, bytes]]]:
    with tarfile.open(bundle) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    return json.loads(members[0][1]), members[1:]


def _write(path: Path, manifest, members, *, rehash: bool = True) -> Path:
    """A bundle of these members; `rehash` lists each file's true size and hash in the manifest."""
    if rehash and isinstance(manifest, dict):
        manifest["files"] = {m.name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                             for m, data in members if m.isreg()}
    text = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        for member, data in members:
            copy = tarfile.TarInfo(member.name)
            copy.type, copy.linkname = member.type, member.linkname
            copy.size = len(data) if member.isreg() else 0
            tar.addfile(copy, io.BytesIO(data) if member.isreg() else None)
    return path


def _flip(data: bytes, at: float = 0.5) -> bytes:
    i = int(len(data) * at)
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]


def _with_environment(manifest, members, **changes):
    """The entry's environment changed consistently (manifest and factors file), hashes recomputed: a genuine
    bundle made elsewhere."""
    (entry_hash, entry), = manifest["entries"].items()
    entry["factors"]["environment"].update(changes)
    out = []
    for member, data in members:
        if member.name.endswith("/" + FACTORS_FILE):
            stored = json.loads(data)
            stored["factors"]["environment"].update(changes)
            data = json.dumps(stored).encode()
        out.append((member, data))
    return manifest, out


def _cases(bundle: Path, tmp: Path) -> dict[str, tuple[Path, str]]:
    raw = bundle.read_bytes()
    manifest, members = _members(bundle)

    def fresh():
        return _members(bundle)

    def artifact(members_):
        return next(i for i, (m, _) in enumerate(members_) if "/artifacts/" in m.name)

    def kernel(members_):
        return next(i for i, (m, _) in enumerate(members_) if m.name.startswith("inductor_cache/"))

    cases: dict[str, tuple[Path, str]] = {}

    def add(name, path, reason):
        cases[name] = (path, reason)

    with tarfile.open(bundle) as tar:   # a cut where a member's header starts reads as a shorter, valid archive
        offsets = [member.offset for member in tar]
    boundary = offsets[len(offsets) // 2]
    for name, size in (("cut at half", len(raw) // 2), ("cut to 10 bytes", 10), ("cut after the manifest", 2048),
                       ("cut at a member boundary", boundary)):
        path = tmp / f"{name}.vgcb"
        path.write_bytes(raw[:size])
        add(name, path, "cut short" if size > 1024 else "not a vgc bundle")
    m, ms = fresh()
    i = artifact(ms)
    ms[i] = (ms[i][0], _flip(ms[i][1]))
    add("flipped artifact byte", _write(tmp / "a.vgcb", m, ms, rehash=False), "does not match the manifest")
    m, ms = fresh()
    i = kernel(ms)
    ms[i] = (ms[i][0], _flip(ms[i][1], 0.1))
    add("flipped kernel byte", _write(tmp / "k.vgcb", m, ms, rehash=False), "does not match the manifest")
    add("manifest not JSON", _write(tmp / "j.vgcb", json.dumps(manifest).encode()[:-3], members, rehash=False),
        "not valid JSON")
    m, ms = fresh()
    first = next(iter(m["files"]))
    m["files"][first]["sha256"] = "0" * 64
    add("wrong hash in the manifest", _write(tmp / "h.vgcb", m, ms, rehash=False), "does not match the manifest")
    m, ms = fresh()
    extra = tarfile.TarInfo(f"{CACHE_SUBDIR}/{next(iter(m['entries']))}/rank_0_0/planted.py")
    add("unlisted member", _write(tmp / "u.vgcb", m, ms + [(extra, b"print('hi')")], rehash=False),
        "is not in the manifest")
    m, ms = fresh()
    i = kernel(ms)
    add("missing kernel", _write(tmp / "mk.vgcb", m, ms[:i] + ms[i + 1:], rehash=False),
        "missing from the bundle")
    m, ms = fresh()
    m["format"] = "tarball"
    add("another format", _write(tmp / "f.vgcb", m, ms), "format is 'tarball'")
    m, ms = fresh()
    m["version"] = 2
    add("a newer bundle version", _write(tmp / "v.vgcb", m, ms), "bundle version 2")
    for name, change, reason in (("another torch", {"torch_version": "2.99.0"}, "torch_version"),
                                 ("another python", {"python": "3.99"}, "environment.python"),
                                 ("another CPU ISA", {"cpu_vec_isa": "avx512"}, "cpu_vec_isa"),
                                 ("another world size", {"world_size": 4}, "world_size"),
                                 ("another vgc", {"vgc_source": "0123456789abcdef"}, "vgc_source"),
                                 ("a CUDA bundle", {"device_type": "cuda", "device_name": "NVIDIA H200",
                                                    "device_capability": "9.0"}, "no CUDA device")):
        m, ms = _with_environment(*fresh(), **change)
        add(name, _write(tmp / f"{name}.vgcb", m, ms), reason)
    m, ms = fresh()
    next(iter(m["entries"].values()))["factors"]["environment"]["torch_version"] = "2.99.0"   # manifest only
    add("manifest disagrees with the entry", _write(tmp / "d.vgcb", m, ms), "disagree with its")
    m, ms = fresh()
    add("path traversal", _write(tmp / "t.vgcb", m, ms + [(tarfile.TarInfo("../escape.py"), b"x")]),
        "points outside the root")
    m, ms = fresh()
    link = tarfile.TarInfo(f"{CACHE_SUBDIR}/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    add("symlink member", _write(tmp / "s.vgcb", m, ms + [(link, b"")], rehash=False), "not a regular file")
    m, ms = fresh()
    add("duplicate member", _write(tmp / "dup.vgcb", m, ms + [ms[0]], rehash=False), "appears twice")
    (tmp / "random.vgcb").write_bytes(os.urandom(4096))
    add("not a tar", tmp / "random.vgcb", "not a vgc bundle")
    (tmp / "empty.vgcb").write_bytes(b"")
    add("empty file", tmp / "empty.vgcb", "not a vgc bundle")
    return cases


def _unpack_and_verify_refuse(root: Path, name: str, path: Path, reason: str, capsys) -> None:
    """`unpack` refuses the bundle naming `reason` and installing nothing, and `verify FILE` fails it (its output
    is left for the caller to read)."""
    capsys.readouterr()
    assert vgc_main(["cache", "--root", str(root), "unpack", str(path)]) == 1, name
    out = capsys.readouterr().out
    assert reason in out and "nothing installed" in out, (name, out)
    assert vgc_main(["cache", "verify", str(path)]) == 1, name


def test_every_damaged_or_foreign_bundle_is_refused_with_its_reason_and_installs_nothing(packed, tmp_path,
                                                                                        capsys):
    _, bundle, _ = packed
    cases = _cases(bundle, tmp_path)
    assert len(cases) >= 20
    root = tmp_path / "root"
    for name, (path, reason) in cases.items():
        _unpack_and_verify_refuse(root, name, path, reason, capsys)
        assert inventory.entries(root) == [], name
    assert not (tmp_path / "escape.py").exists() and not list(root.glob(".vgc-*"))
    assert not list(root.rglob("link"))


def test_a_full_disk_while_unpacking_is_named_and_installs_nothing(packed, tmp_path, monkeypatch, capsys):
    _, bundle, _ = packed
    root = tmp_path / "root"
    written, write = [], bundle_check._write_chunk

    class FullDisk:
        def write(self, chunk):
            raise OSError(28, os.strerror(28))

    def full_after_two(target, chunk):   # the third file's write finds the disk full
        if len(written) == 2:
            return write(FullDisk(), chunk)
        written.append(len(chunk))
        return write(target, chunk)

    monkeypatch.setattr(bundle_check, "_write_chunk", full_after_two)
    assert vgc_main(["cache", "--root", str(root), "unpack", str(bundle)]) == 2   # the root's problem: status 2
    out = capsys.readouterr().out
    assert f"the cache root {root} has no space or no inodes left (No space left on device" in out, out
    assert "nothing was installed" in out and "damaged" not in out and "cut short" not in out, out
    assert inventory.entries(root) == [] and not list(root.glob(".vgc-*"))



# ---- hostile manifests, damage behind recomputed hashes, and the root's problems (issue 51) ----
def _renamed_entry(bundle: Path, new_name: str):
    """The bundle with its entry (manifest key and member paths) renamed to `new_name`, hashes recomputed."""
    manifest, members = _members(bundle)
    (old, entry), = manifest["entries"].items()
    manifest["entries"] = {new_name: entry}
    prefix, out = f"{CACHE_SUBDIR}/{old}/", []
    for member, data in members:
        if member.name.startswith(prefix):
            member = copy.copy(member)
            member.name = f"{CACHE_SUBDIR}/{new_name}/{member.name[len(prefix):]}"
        out.append((member, data))
    return manifest, out


def _member_index(members, part: str) -> int:
    return next(i for i, (m, _) in enumerate(members) if part in m.name)


def _hostile_cases(bundle: Path, tmp: Path) -> dict[str, tuple[Path, str]]:
    cases: dict[str, tuple[Path, str]] = {}
    _, members = _members(bundle)
    (entry_hash,) = _members(bundle)[0]["entries"]
    rank = f"{CACHE_SUBDIR}/{entry_hash}/rank_0_0"

    def add(name, manifest, members_, reason, rehash=True):
        cases[name] = (_write(tmp / f"hostile-{len(cases)}.vgcb", manifest, members_, rehash=rehash), reason)

    deep = (b'{"format": "vgc-cache-bundle", "version": 1, "files": {}, "entries": ' + b"[" * 5000 + b"]" * 5000
            + b"}")
    add("manifest nested 5000 deep", deep, members, "its manifest nests 5001 levels deep", rehash=False)
    m, ms = _members(bundle)
    nested: dict = {}
    for _ in range(20):
        nested = {"x": nested}
    next(iter(m["entries"].values()))["factors"]["config"]["inductor_compile_config"] = nested
    add("factors nested 20 deep", m, ms, "levels deep, past the limit")
    for label, name in (("entry ab/cd", "ab/cd"), ("entry outside the root", str(tmp / "escaped")),
                        ("entry .", "."), ("entry ..", "..")):
        add(label, *_renamed_entry(bundle, name), "an entry's name is 20 hex digits")
    m, ms = _members(bundle)
    next(iter(m["entries"].values()))["ranks"] = ["../rank_0_0"]
    add("rank ../rank_0_0", m, ms, "a rank directory is rank_")
    m, ms = _members(bundle)
    i = _member_index(ms, "/index.json")
    dotted = copy.copy(ms[i][0])
    dotted.name = f"{rank}/./index.json"
    add("two names for one file", m, ms + [(dotted, ms[i][1])], "not in canonical form")
    m, ms = _members(bundle)
    stray = tarfile.TarInfo(f"{CACHE_SUBDIR}/{'f' * 20}/rank_0_0/index.json")
    add("a file of an unlisted entry", m, ms + [(stray, b"{}")], "not inside a rank directory of an entry")
    m, ms = _members(bundle)
    under = tarfile.TarInfo(f"{rank}/index.json/planted")
    add("a file under a file", m, ms + [(under, b"x")], "is listed as a file and as the directory of")
    m, ms = _members(bundle)
    deep_name = tarfile.TarInfo("inductor_cache/" + "/".join(["d"] * 16) + "/k.so")
    add("a name 17 directories deep", m, ms + [(deep_name, b"x")], "directories deep, more than 16")
    m, ms = _members(bundle)
    m["files"] = {n: {"size": True, "sha256": "0" * 64} for n in m["files"]}   # a bool is not a size
    add("sizes that are not numbers", m, ms, "is not a size and a sha256", rehash=False)
    # damage inside an entry, with the bundle's own hashes recomputed over it
    m, ms = _members(bundle)
    i = _member_index(ms, "/artifacts/")
    ms[i] = (ms[i][0], _flip(ms[i][1]))
    add("artifact changed, hashes recomputed", m, ms, "does not match the record's content hash")
    m, ms = _members(bundle)
    i = _member_index(ms, "/trace-")
    ms[i] = (ms[i][0], _flip(ms[i][1]))
    add("trace changed, hashes recomputed", m, ms, "fails its content hash")
    m, ms = _members(bundle)
    add("index left out", m, [(a, d) for a, d in ms if not a.name.endswith("/index.json")],
        "index.json is missing while 3 artifact files are bundled")
    m, ms = _members(bundle)
    i = _member_index(ms, "/index.json")
    index = json.loads(ms[i][1])
    first, second = sorted(index)[:2]
    index[first]["sha256"], index[second]["sha256"] = index[second]["sha256"], index[first]["sha256"]
    ms[i] = (ms[i][0], json.dumps(index).encode())
    add("index records swapped", m, ms, "does not match the record's content hash")
    m, ms = _members(bundle)   # another entry's index (its records name where they were written), swapped in
    i = _member_index(ms, "/index.json")
    index = json.loads(ms[i][1])
    for record in index.values():
        record["entry"] = f"{'f' * 20}/rank_0_0"
    ms[i] = (ms[i][0], json.dumps(index).encode())
    add("index of another entry", m, ms, f"index.json was written for {'f' * 20}/rank_0_0, not for "
        f"{entry_hash}/rank_0_0 (copied or swapped in from another entry)")
    m, ms = _members(bundle)
    i = _member_index(ms, ".main.so")
    ms[i] = (ms[i][0], _flip(ms[i][1], 0.9))
    add("compiled kernel changed, hashes recomputed", m, ms, "does not match the content hash")
    m, ms = _members(bundle)
    i = _member_index(ms, "/" + FACTORS_FILE)
    ms[i] = (ms[i][0], b"[" * 3000 + b"]" * 3000)
    add("factors file nested 3000 deep", m, ms, 'not a JSON object with a "hash"')
    m, ms = _members(bundle)   # forged: two generated modules swapped, every record and hash recomputed over them
    first, second = [i for i, (x, _) in enumerate(ms) if x.name.startswith("inductor_cache/") and
                     x.name.endswith(".py") and "/fxgraph/" not in x.name][:2]
    ms[first], ms[second] = (ms[first][0], ms[second][1]), (ms[second][0], ms[first][1])
    for i, (x, data) in enumerate(ms):
        if x.name.endswith("/kernels.json"):
            record = json.loads(data)
            for moved in (ms[first], ms[second]):
                relative = moved[0].name[len("inductor_cache/"):]
                if relative in record:
                    record[relative] = hashlib.sha256(moved[1]).hexdigest()
            ms[i] = (x, json.dumps(record).encode())
    add("generated modules swapped, their records recomputed", m, ms, "holds other code than its name says")
    return cases


def test_hostile_manifests_and_damage_behind_recomputed_hashes_are_refused_without_a_traceback(packed, tmp_path,
                                                                                                capsys):
    """Each case names its reason in one line from `unpack`, `verify FILE` and `show FILE` (a RecursionError or
    an OSError would escape `vgc_main` and fail the test), and nothing is written under the root or outside it."""
    _, bundle, _ = packed
    cases = _hostile_cases(bundle, tmp_path)
    assert len(cases) == 20
    root = tmp_path / "root"
    for name, (path, reason) in cases.items():
        _unpack_and_verify_refuse(root, name, path, reason, capsys)
        assert reason in capsys.readouterr().out, name
        assert vgc_main(["cache", "show", str(path)]) == 1, name
        assert reason in capsys.readouterr().out, name
        assert inventory.entries(root) == [] and not list(root.glob(".vgc-*")), name
    assert not (tmp_path / "escaped").exists() and not (root / "torch_compile_cache" / "ab").exists()


def _hold(lock: Path) -> subprocess.Popen:
    """Another process holding `lock` until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from filelock import FileLock; "
                               "lock = FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
                               "sys.stdin.read()", str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _release(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    holder.wait(timeout=30)


def _private_root(path: Path) -> Path:
    path.mkdir(mode=0o700)
    (path / "locks").mkdir(mode=0o700)
    return path


def test_unpack_waits_a_bounded_reported_time_for_a_held_entry_lock(packed, tmp_path, monkeypatch, capsys, caplog):
    _, bundle, _ = packed
    (entry_hash,) = bundles.check(bundle).entries
    root = _private_root(tmp_path / "root")
    lock = root / "locks" / f"entry-{entry_hash}.lock"
    holder = _hold(lock)
    try:
        monkeypatch.setattr(bundles, "LOCK_WAIT_S", 1.0)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="vgc"):
            assert vgc_main(["cache", "--root", str(root), "unpack", str(bundle)]) == 2
        assert time.monotonic() - started < 30
        out = capsys.readouterr().out
        assert f"{lock} was still held by another process after 1 s" in out and "nothing was installed" in out, out
        (waiting,) = [r.getMessage() for r in caplog.records if "waiting up to 1 s" in r.getMessage()]
        assert entry_hash in waiting and str(lock) in waiting
        assert inventory.entries(root) == [] and not list(root.glob(".vgc-*"))
    finally:
        _release(holder)
    assert vgc_main(["cache", "--root", str(root), "unpack", str(bundle)]) == 0


def _unpack_in_child(bundle: str, root: str) -> None:
    sys.exit(vgc_main(["cache", "--root", root, "unpack", bundle]))


def _wait_for(found, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found():
            return found()
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_stopped_or_killed_unpack_leaves_no_staging_copy_and_the_next_one_installs(packed, tmp_path):
    """SIGTERM ends a waiting unpack through its cleanup; SIGKILL cannot be caught, and the next unpack removes
    what the killed one left. The children are forked, so they see the vgc sources the bundle was packed from."""
    _, bundle, _ = packed
    (entry_hash,) = bundles.check(bundle).entries
    root = _private_root(tmp_path / "root")
    holder = _hold(root / "locks" / f"entry-{entry_hash}.lock")   # each child extracts, then waits for this
    fork = multiprocessing.get_context("fork")
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            child = fork.Process(target=_unpack_in_child, args=(str(bundle), str(root)))
            child.start()
            staging = _wait_for(lambda: list(root.glob(".vgc-unpack-*/torch_compile_cache/*/rank_0_0/index.json")))
            os.kill(child.pid, sig)
            child.join(30)
            assert child.exitcode == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
            left = list(root.glob(".vgc-unpack-*"))
            assert (left == []) == (sig == signal.SIGTERM), (sig, staging, left)
    finally:
        _release(holder)
    assert bundles.unpack(bundle, root) == {entry_hash: "installed"}
    assert not list(root.glob(".vgc-*"))
    assert vgc_main(["cache", "--root", str(root), "verify"]) == 0


def test_unpack_replaces_an_intact_but_partial_entry_with_the_bundles_complete_one(packed, tmp_path, capsys):
    """An entry a stopped start left with fewer artifacts verifies clean, but the bundle's holds more: it wins."""
    _, bundle, _ = packed
    root = tmp_path / "root"
    (entry_hash,) = bundles.unpack(bundle, root)
    (rank,) = inventory.find_entry(root, entry_hash).rank_dirs()
    index = json.loads((rank / "index.json").read_text())
    name, record = sorted(index.items())[0]
    del index[name]
    (rank / "index.json").write_text(json.dumps(index))
    (rank / "artifacts" / record["file"]).unlink()
    capsys.readouterr()
    assert vgc_main(["cache", "--root", str(root), "verify"]) == 0   # nothing damaged: only less
    assert bundles.unpack(bundle, root) == {entry_hash: "replaced"}
    assert name in json.loads((rank / "index.json").read_text()) and (rank / "artifacts" / record["file"]).is_file()
    assert bundles.unpack(bundle, root) == {entry_hash: "kept"}
    assert not list(root.glob(".vgc-*"))


@pytest.mark.parametrize("kind", ["read-only", "no inodes left"])
def test_a_root_that_cannot_take_the_bundle_is_named_not_the_bundle(packed, tmp_path, capsys, kind):
    _, bundle, _ = packed
    root = tmp_path / "root"
    if not mount_tmpfs(root, "size=64m" + (",nr_inodes=24" if kind == "no inodes left" else "")):
        pytest.skip("cannot mount a tmpfs here (needs root); the injected-ENOSPC test above still runs")
    try:
        if kind == "read-only" and subprocess.run(["mount", "-o", "remount,ro", str(root)],
                                                  capture_output=True, timeout=30).returncode != 0:
            pytest.skip("cannot remount the tmpfs read-only here")
        capsys.readouterr()
        assert vgc_main(["cache", "--root", str(root), "unpack", str(bundle)]) == 2
        out = capsys.readouterr().out
        cause = "cannot be written (Read-only file system" if kind == "read-only" else \
            "has no space or no inodes left (No space left on device"
        assert f"the cache root {root} {cause}" in out, out
        assert "nothing was installed" in out and "not the bundle's" in out and "damaged" not in out, out
        assert inventory.entries(root) == [] and not list(root.glob(".vgc-*"))
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, timeout=30)
