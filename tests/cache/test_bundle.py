"""One-file cache bundles (`vgc cache pack` / `unpack`): reproducible, relocatable (another root, HOME, TMPDIR and
XDG_CACHE_HOME in a fresh process: 0 Inductor calls, outputs equal to the packing process's), and every damaged
or foreign bundle refused with its reason, installing nothing."""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from vgc.cache import bundle as bundles
from vgc.cache import cpu_isa, inventory
from vgc.cache.layout import CACHE_SUBDIR, FACTORS_FILE
from vgc.cli import main as vgc_main

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


def test_every_damaged_or_foreign_bundle_is_refused_with_its_reason_and_installs_nothing(packed, tmp_path,
                                                                                        capsys):
    _, bundle, _ = packed
    cases = _cases(bundle, tmp_path)
    assert len(cases) >= 20
    root = tmp_path / "root"
    for name, (path, reason) in cases.items():
        capsys.readouterr()
        assert vgc_main(["cache", "--root", str(root), "unpack", str(path)]) == 1, name
        out = capsys.readouterr().out
        assert reason in out and "nothing installed" in out, (name, out)
        assert vgc_main(["cache", "verify", str(path)]) == 1, name
        assert inventory.entries(root) == [], name
    assert not (tmp_path / "escape.py").exists() and not list(root.glob(".vgc-*"))
    assert not list(root.rglob("link"))


def test_a_full_disk_while_unpacking_is_named_and_installs_nothing(packed, tmp_path, monkeypatch, capsys):
    _, bundle, _ = packed
    root = tmp_path / "root"
    written, write = [], bundles._write_chunk

    class FullDisk:
        def write(self, chunk):
            raise OSError(28, os.strerror(28))

    def full_after_two(target, chunk):   # the third file's write finds the disk full
        if len(written) == 2:
            return write(FullDisk(), chunk)
        written.append(len(chunk))
        return write(target, chunk)

    monkeypatch.setattr(bundles, "_write_chunk", full_after_two)
    assert vgc_main(["cache", "--root", str(root), "unpack", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "cannot be extracted under the root (No space left on device)" in out and "nothing installed" in out
    assert inventory.entries(root) == [] and not list(root.glob(".vgc-*"))

