"""Injected faults in a real warm cache root: no fault may crash a start, give a wrong answer or outlast the
next start.

A warm root is built once by a real process; each fault is applied to its own copy. `fault_worker.py` then
serves every faulted root in one process (pass 1: the start after the fault) and again in a second process
(pass 2: the start after that, which must be warm again). The suite runs a seeded sample that covers every
file kind; `VGC_FAULTS=120 pytest tests/test_faults.py -k campaign -s` runs the full campaign and prints its
table (docs/cache.md has the latest one).
"""

import collections
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vgc
from vgc.cache import inventory
from vgc.shells import verify
from vgc.cache.layout import ARTIFACT_DIR
from conftest import mount_tmpfs

WORKERS = Path(__file__).parents[1] / "workers"
FAULT_COUNT = int(os.environ.get("VGC_FAULTS", "12"))
SEED = int(os.environ.get("VGC_FAULT_SEED", "0"))
TOL = 1e-4   # fp32, compiled vs eager on the tiny decoder

JSON_SCHEMA_FAULTS = ("[]", '{"x": {"format": "binary"}}', '{"x": {"file": "../../escape", "format": "binary", '
                      '"bytes": 1, "sha256": "0"}}', '"a string"')


def _env(root=None, **extra):
    env = dict(os.environ, **extra)
    if root is not None:
        env["VGC_CACHE_ROOT"] = str(root)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)   # each root keeps Inductor's cache under it, as users get it
    return env


def run_passes(roots, tmp_path, name, env=None):
    """Serve every root in one worker process; returns {root: report}. A crash leaves its root without a report."""
    roots_file, out = tmp_path / f"{name}-roots.json", tmp_path / f"{name}.jsonl"
    roots_file.write_text(json.dumps([str(r) for r in roots]))
    proc = subprocess.run([sys.executable, str(WORKERS / "fault_worker.py"), str(roots_file), str(out)],
                          env=env or _env(), capture_output=True, text=True, timeout=3000)
    reports = {}
    if out.exists():
        for line in out.read_text().splitlines():
            report = json.loads(line)
            reports[report["root"]] = report
    if proc.returncode != 0:
        crashed = [str(r) for r in roots if str(r) not in reports]
        pytest.fail(f"fault worker died (rc {proc.returncode}) serving {crashed[:1]}:\n{proc.stderr[-3000:]}")
    return reports


@pytest.fixture(scope="module")
def warm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm") / "root"
    base = tmp_path_factory.mktemp("warm-runs")
    for name in ("cold", "warm"):
        report = run_passes([root], base, name)[str(root)]
        assert report["error"] is None and report["max_diff"] < TOL, report
    assert report["counters"]["inductor_compiles"] == 0 and report["warnings"] == [], report
    return root


# ---- the faults ----
def _targets(root: Path) -> dict[str, list[Path]]:
    (entry,) = inventory.entries(root)
    (rank,) = entry.rank_dirs()
    kernels = [p for p in (root / "inductor_cache").rglob("*") if p.is_file()]
    return {
        "index": [rank / "index.json"],
        "factors": [rank / "cache_key_factors.json"],
        "artifact": sorted((rank / ARTIFACT_DIR).iterdir()),
        "lock": sorted((rank / "locks").glob("*.lock")),
        "locks_dir": [rank / "locks"],
        "debug": [rank / "computation_graph.py", rank / "transformed_code.py"],
        "trace": sorted(rank.glob("trace-*.bin")),
        "kernel_so": sorted(p for p in kernels if p.suffix == ".so"),
        "kernel_py": sorted(p for p in kernels if p.suffix == ".py"),
        "kernel_other": sorted(p for p in kernels if p.suffix not in (".so", ".py", ".lock")),
        "root": [root],
    }


OPS = {
    "root": ("mode_777", "other_owner", "is_a_file"),
    "locks_dir": ("file", "loop", "delete"),
}
FILE_OPS = ("truncate", "zero", "garbage", "directory", "loop", "delete")
JSON_KINDS = ("index", "factors")
# Kinds whose file can be swapped with another of the same kind (issue 51: swapped kernels crashed every start)
SWAP_KINDS = ("artifact", "kernel_so", "kernel_py", "kernel_other")


def plan_faults(root: Path, count: int, seed: int) -> list[tuple[str, str, str]]:
    """(kind, op, path relative to root): every (kind, op) pair in turn, files drawn with `seed`."""
    rng = random.Random(seed)
    targets = {k: v for k, v in _targets(root).items() if v}
    pairs = []
    for kind in targets:
        ops = OPS.get(kind, FILE_OPS + (("schema",) if kind in JSON_KINDS else ())
                      + (("swap",) if kind in SWAP_KINDS and len(_swappable(targets[kind])) > 1 else ()))
        pairs += [(kind, op) for op in ops]
    rng.shuffle(pairs)
    # the sample the suite runs must touch every kind: order pairs so that kinds alternate
    by_kind = collections.defaultdict(list)
    for kind, op in pairs:
        by_kind[kind].append(op)
    ordered = []
    while any(by_kind.values()):
        for kind in list(by_kind):
            if by_kind[kind]:
                ordered.append((kind, by_kind[kind].pop()))
    plan = []
    while len(plan) < count:
        kind, op = ordered[len(plan) % len(ordered)]
        path = rng.choice(_swappable(targets[kind]) if op == "swap" else targets[kind])
        plan.append((kind, op, str(path.relative_to(root)) if path != root else "."))
    return plan


def _swappable(paths: list[Path]) -> list[Path]:
    """The files that have another of the same suffix with other bytes (a swap changes both)."""
    return [p for p in paths if any(q.suffixes == p.suffixes and q.read_bytes() != p.read_bytes() for q in paths)]


def apply_fault(root: Path, kind: str, op: str, rel: str, rng: random.Random) -> None:
    path = root / rel
    if op == "swap":   # its bytes exchanged with another file of its kind (same suffixes, other bytes)
        other = rng.choice([q for q in _targets(root)[kind] if q.suffixes == path.suffixes and
                            q.read_bytes() != path.read_bytes()])
        held = path.read_bytes()
        path.write_bytes(other.read_bytes())
        other.write_bytes(held)
    elif op == "mode_777":
        path.chmod(0o777)
    elif op == "other_owner":
        os.chown(path, 12345, 12345)
    elif op == "is_a_file":
        shutil.rmtree(path)
        path.write_text("not a directory\n")
    elif op == "file":
        shutil.rmtree(path)
        path.write_bytes(b"")
    elif op == "delete":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    elif op == "loop":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.symlink_to(path.name)   # a link to itself: ELOOP on every access
    elif op == "directory":   # as root nothing is unreadable by mode; a directory where a file goes is
        path.unlink()
        path.mkdir()
    elif op == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif op == "zero":
        path.write_bytes(b"")
    elif op == "garbage":
        path.write_bytes(rng.randbytes(max(16, path.stat().st_size)))
    elif op == "schema":
        path.write_text(rng.choice(JSON_SCHEMA_FAULTS))
    else:
        raise ValueError(op)


def expected_refusal(kind: str, op: str) -> bool:
    """Faults whose right answer is to run without the cache at every start (an untrusted or unusable root)."""
    return kind == "root"


def _verify(root: Path) -> list[str]:
    """What `vgc cache verify` finds: (path, problem) lines; a root it cannot check counts as flagged."""
    try:
        return [f"{path}: {problem}" for path, problem in verify.verify_root(root)]
    except verify.CannotVerify as e:
        return [str(e)]


def run_campaign(warm_root, tmp_path, count, seed):
    rng = random.Random(seed)
    roots, faults = [], {}
    for i, (kind, op, rel) in enumerate(plan_faults(warm_root, count, seed)):
        copy = tmp_path / f"fault-{i:03d}-{kind}-{op}"
        shutil.copytree(warm_root, copy, symlinks=True)
        apply_fault(copy, kind, op, rel, rng)
        verdict = _verify(copy)
        roots.append(copy)
        faults[str(copy)] = {"kind": kind, "op": op, "file": rel, "verify": verdict}
    first = run_passes(roots, tmp_path, "pass1")
    second = run_passes(roots, tmp_path, "pass2")
    rows = []
    for root in roots:
        fault, a, b = faults[str(root)], first[str(root)], second[str(root)]
        harmful = bool(a["warnings"]) or a["counters"]["inductor_compiles"] > 0
        rows.append({**fault, "pass1": a, "pass2": b, "harmful": harmful})
    return rows


def _problems(row) -> list[str]:
    a, b, found = row["pass1"], row["pass2"], []
    for name, report in (("start after the fault", a), ("next start", b)):
        if report["error"] is not None:
            found.append(f"{name} failed: {report['error'][-600:]}")
        elif report["max_diff"] is None or report["max_diff"] > TOL:
            found.append(f"{name} gave a wrong answer (max diff {report['max_diff']})")
    if not expected_refusal(row["kind"], row["op"]) and b["error"] is None:
        if b["counters"]["inductor_compiles"] or b["warnings"]:
            found.append(f"next start not warm again: {b['counters']['inductor_compiles']} compiles, "
                         f"warnings {b['warnings'][:2]}")
    if row["verify"] is not None and row["harmful"] != bool(row["verify"]) and not expected_refusal(
            row["kind"], row["op"]):
        found.append(f"verify says {row['verify'][:2] or 'clean'} for a {'harmful' if row['harmful'] else 'harmless'}"
                     " fault")
    return found


def _table(rows) -> str:
    groups = collections.defaultdict(lambda: collections.Counter())
    for row in rows:
        g = groups[row["kind"]]
        g["faults"] += 1
        g["harmful"] += row["harmful"]
        g["crashes"] += any(r["error"] is not None for r in (row["pass1"], row["pass2"]))
        g["wrong"] += any(r["max_diff"] is not None and r["max_diff"] > TOL for r in (row["pass1"], row["pass2"]))
        g["persistent"] += bool(not expected_refusal(row["kind"], row["op"]) and row["pass2"]["error"] is None and
                                (row["pass2"]["counters"]["inductor_compiles"] or row["pass2"]["warnings"]))
        g["verify flagged"] += bool(row["verify"])
    cols = ("faults", "harmful", "crashes", "wrong", "persistent", "verify flagged")
    lines = ["| file kind | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind in sorted(groups):
        lines.append(f"| {kind} | " + " | ".join(str(groups[kind][c]) for c in cols) + " |")
    total = collections.Counter()
    for g in groups.values():
        total.update(g)
    lines.append("| **all** | " + " | ".join(str(total[c]) for c in cols) + " |")
    return "\n".join(lines)


def test_fault_campaign(warm_root, tmp_path):
    rows = run_campaign(warm_root, tmp_path, FAULT_COUNT, SEED)
    print(f"\nfault campaign: {len(rows)} faults, seed {SEED}\n" + _table(rows))
    failures = {f"{r['kind']}/{r['op']} on {r['file']}": p for r in rows if (p := _problems(r))}
    assert not failures, json.dumps(failures, indent=1)[:6000]
    assert sum(r["harmful"] for r in rows) > 0   # the sample must include faults that change what a start does


# ---- a killed start, a full disk ----
def test_a_start_killed_while_compiling_leaves_a_root_the_next_starts_recover(tmp_path):
    root = tmp_path / "root"
    roots_file, out = tmp_path / "roots.json", tmp_path / "killed.jsonl"
    roots_file.write_text(json.dumps([str(root)]))
    proc = subprocess.Popen([sys.executable, str(WORKERS / "fault_worker.py"), str(roots_file), str(out)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # kill once Inductor is writing kernels: the moment a half-written .so or index can be left behind
    while time.monotonic() < deadline and proc.poll() is None:
        if any((root / "inductor_cache").rglob("*.cpp")) if (root / "inductor_cache").exists() else False:
            time.sleep(random.Random(SEED).uniform(0.0, 1.5))
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = run_passes([root], tmp_path, "after-kill")[str(root)]
    again = run_passes([root], tmp_path, "again")[str(root)]
    for report in (after, again):
        assert report["error"] is None and report["max_diff"] < TOL, report
    assert again["counters"]["inductor_compiles"] == 0 and again["warnings"] == [], again


@pytest.mark.parametrize("suffix,forged", [(".so", False), (".py", False), (".py", True)])
def test_two_kernels_swapped_are_caught_by_their_recorded_hashes(warm_root, tmp_path, suffix, forged):
    """Issue 51: Inductor names kernel files by their source's hash and loads them unchecked, so two compiled `.so`
    swapped crashed every start ("requires 2 args", or heap corruption), two generated `.py` swapped too ("too many
    values to unpack"), and verify passed the root. vgc records each file's content hash when the entry saves: the
    swapped files are named by verify, removed at the next start (one warning each, counted as damage) and built
    again by Inductor from the artifacts; the start after that is warm and silent. `forged`: every record rewritten
    with the swapped bytes' hashes (the bundle campaign's forged bundles crashed every start): a generated module is
    also checked against its own name, the hash of the source Inductor wrote there."""
    from vgc.cache import kernel_hashes

    root = tmp_path / "root"
    shutil.copytree(warm_root, root, symlinks=True)
    kernels = root / "inductor_cache"
    files = sorted(p for p in kernels.rglob(f"*{suffix}")
                   if p.is_file() and kernel_hashes.tracked(p.relative_to(kernels).as_posix()))
    first = files[0]
    second = next(p for p in files[1:] if p.read_bytes() != first.read_bytes())
    held = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(held)
    if forged:
        for record_path in root.rglob(kernel_hashes.RECORD_FILE):
            record = json.loads(record_path.read_text())
            for path in (first, second):
                relative = path.relative_to(kernels).as_posix()
                if relative in record:
                    record[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
            record_path.write_text(json.dumps(record))
    assert {first, second} <= {path for path, _ in verify.verify_root(root)}
    swapped = run_passes([root], tmp_path, "swapped")[str(root)]
    assert swapped["error"] is None and swapped["max_diff"] < TOL, swapped
    assert swapped["counters"]["inductor_compiles"] == 0 and swapped["counters"]["cache_corrupt"] == 2, swapped
    named = [w for w in swapped["warnings"]
             if ("holds other code than its name says" if forged else "does not match the content hash") in w]
    assert len(named) == 2 and len(swapped["warnings"]) == 2, swapped["warnings"]
    after = run_passes([root], tmp_path, "after")[str(root)]
    assert after["error"] is None and after["max_diff"] < TOL and after["warnings"] == [], after
    assert after["counters"]["inductor_compiles"] == 0 and verify.verify_root(root) == []


def test_a_recorded_kernel_that_is_missing_is_recorded_again_once_rebuilt(tmp_path, monkeypatch, caplog):
    """Issue 51 (bundle campaign, seed 5106): a bundle packed without its kernels (`--no-kernels`, or one kernel left
    out) left kernels.json naming the packing machine's bytes; Inductor builds the files again here, with other
    bytes (a C++ build elsewhere need not be byte-identical), and every later check found them "swapped or altered":
    removed, rebuilt and warned about again in the next start (6 warnings in two starts), and, between two entries
    of one process, in the same start. A recorded file found missing is now dropped from every record, as a removed
    one is, so the bytes built here are recorded and the next start is quiet."""
    from vgc import log
    from vgc.cache import kernel_hashes

    monkeypatch.setattr(kernel_hashes, "_seen", {})
    monkeypatch.setattr(kernel_hashes, "_rebuilt", set())
    log._warned.clear()
    kernels = tmp_path / "inductor_cache"
    ranks = [tmp_path / "torch_compile_cache" / entry / "rank_0_0" for entry in ("a" * 20, "b" * 20)]
    for rank in ranks:   # both entries record the packing machine's bytes of one kernel, which is not here
        rank.mkdir(parents=True)
        (rank / kernel_hashes.RECORD_FILE).write_text(json.dumps({"ab/cab.main.so": "0" * 64, "ab/cab.py": "1" * 64}))
    with caplog.at_level(logging.WARNING, logger="vgc"):
        assert kernel_hashes.check(tmp_path, kernels) == 0
        (kernels / "ab").mkdir(parents=True)
        (kernels / "ab" / "cab.main.so").write_bytes(b"\x7fELF built here")   # Inductor builds it again
        assert kernel_hashes.check(tmp_path, kernels) == 0   # the other entry's first load, in the same process
        kernel_hashes.update(ranks[0], kernels)   # the save (or the exit) of the first entry
        monkeypatch.setattr(kernel_hashes, "_seen", {})   # the next process
        monkeypatch.setattr(kernel_hashes, "_rebuilt", set())
        assert kernel_hashes.check(tmp_path, kernels) == 0
    assert caplog.records == [] and (kernels / "ab" / "cab.main.so").is_file()
    recorded = json.loads((ranks[0] / kernel_hashes.RECORD_FILE).read_text())
    assert recorded == {"ab/cab.main.so": hashlib.sha256(b"\x7fELF built here").hexdigest()}
    assert verify.verify_root(tmp_path) == []


@pytest.mark.parametrize("size", ["256k", pytest.param("2m", marks=pytest.mark.extended), "ro"])
def test_a_full_or_read_only_disk_degrades_to_running_without_saving(tmp_path, size):
    root = tmp_path / "small-disk"
    if not mount_tmpfs(root, "size=1m,ro" if size == "ro" else f"size={size}"):
        pytest.skip("cannot mount a tmpfs here (needs root); the injected-ENOSPC test below still runs")
    try:
        report = run_passes([root], tmp_path, "full")[str(root)]
        assert report["error"] is None and report["max_diff"] < TOL, report
        assert not any("VGC_CACHE_TRUST" in w for w in report["warnings"]), report   # the disk, not trust, is tested
        if size == "ro":   # nothing can be created under it: the warning names the setting the root came from
            assert any("VGC_CACHE_ROOT=" in w and "Read-only file system" in w for w in report["warnings"]), report
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, timeout=30)


def test_a_warm_root_made_read_only_still_starts_and_answers_right(tmp_path):
    """A root written by a cold start, then mounted read-only (a deployment's image): Inductor's CPU check, which
    builds and locks a test library under the root's kernel cache, used to crash every start while vgc computed
    the cache key. Now Inductor's cache moves to a private directory up front, with one warning, and every
    artifact loads from the root: no compile."""
    root = tmp_path / "image"
    if not mount_tmpfs(root, "size=64m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        cold = run_passes([root], tmp_path, "cold")[str(root)]
        assert cold["error"] is None and cold["max_diff"] < TOL, cold
        remounted = subprocess.run(["mount", "-o", "remount,ro", str(root)], capture_output=True, timeout=30)
        if remounted.returncode != 0:
            pytest.skip("cannot remount the tmpfs read-only here")
        for name in ("warm-ro", "warm-ro-again"):
            report = run_passes([root], tmp_path, name)[str(root)]
            assert report["error"] is None and report["max_diff"] < TOL, report
            assert report["counters"]["artifacts_loaded"] > 0, report   # the root still serves what it holds
            assert report["counters"]["inductor_compiles"] == 0, report
            assert len(report["warnings"]) == 1 and "read-only" in report["warnings"][0], report["warnings"]
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, timeout=30)


def _fill(root: Path, leave: int = 0) -> None:
    """Fill the file system of `root` to the last byte, then free `leave` bytes (a file written first)."""
    reserve = root / "reserve"
    if leave:
        reserve.write_bytes(b"\0" * leave)
    subprocess.run(["dd", "if=/dev/zero", f"of={root / 'filler'}", "bs=1M"], capture_output=True, timeout=120)
    if leave:
        reserve.unlink()


def _empty(root: Path) -> None:
    for name in ("filler", "reserve"):
        if (root / name).exists():
            (root / name).unlink()


def _use_every_inode(root: Path) -> None:
    """Shrink the tmpfs at `root` to the inodes it uses now: no file can be created, though bytes are free."""
    info = os.statvfs(root)
    subprocess.run(["mount", "-o", f"remount,nr_inodes={info.f_files - info.f_ffree}", str(root)], check=True,
                   capture_output=True, timeout=30)


def test_a_warm_start_on_a_full_disk_loads_what_is_there_and_warns_once(tmp_path):
    """Issue 51: a warm root whose disk then filled took every intact artifact for damage ("unusable (load failed:
    ENOSPC)"), compiled them all again and warned 12 times. A full disk is not damage: every artifact and the
    saved trace load, nothing compiles, one warning names the root and the cause, and verify finds nothing bad.
    Three ways full: no byte left (found before anything loads), a few KiB left (found when Inductor's first write
    fails while loading), no inode left."""
    root = tmp_path / "disk"
    if not mount_tmpfs(root, "size=64m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        cold = run_passes([root], tmp_path, "cold")[str(root)]
        assert cold["error"] is None and cold["max_diff"] < TOL and cold["counters"]["inductor_compiles"] > 0, cold
        for name, fill in (("no space", _fill), ("no space, again", lambda r: None),
                           ("8 KiB left", lambda r: (_empty(r), _fill(r, leave=8192))),
                           ("no inodes", lambda r: (_empty(r), _use_every_inode(r)))):
            fill(root)
            report = run_passes([root], tmp_path, name.replace(" ", "-").replace(",", ""))[str(root)]
            assert report["error"] is None and report["max_diff"] < TOL, (name, report)
            counters = report["counters"]
            assert counters["inductor_compiles"] == 0 and counters.get("cache_corrupt", 0) == 0, (name, counters)
            assert counters["artifacts_loaded"] == cold["counters"]["artifacts_saved"], (name, counters)
            assert counters["traces_loaded"] == 1 and counters["dynamo_traces"] == 0, (name, counters)
            assert len(report["warnings"]) == 1, (name, report["warnings"])
            assert f"cannot write under {root} (No space left on device" in report["warnings"][0], (name, report)
            assert verify.verify_root(root) == [], name   # nothing was damaged, nothing was taken for damage
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, timeout=30)


def test_an_injected_enospc_on_every_cache_write_still_compiles_and_warns_once(tmp_path, monkeypatch, caplog):
    import errno

    import torch
    from vgc.cache import store as store_module
    from vgc.models import llama

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path))

    monkeypatch.setenv("VGC_CACHE_ROOT", str(tmp_path / "root"))
    monkeypatch.setattr(store_module, "atomic_write", full)
    monkeypatch.setattr(store_module._compat, "save_artifact", full)
    vgc.log._warned.clear()
    torch.manual_seed(0)
    cfg = llama.tiny_config()
    model = llama.Llama(cfg)
    compiled = vgc.compile(model)
    batch = llama.make_batch(cfg, 5, "prefill")
    with caplog.at_level("WARNING", logger="vgc"):
        out = compiled(**batch)
    torch.testing.assert_close(out, model(**batch), atol=TOL, rtol=TOL)
    full_disk = [r for r in caplog.records if "No space left" in r.getMessage()]
    assert len(full_disk) >= 1 and len(full_disk) <= 2, [r.getMessage() for r in caplog.records]


def test_a_compiler_that_runs_out_of_disk_moves_the_kernel_cache_off_and_compiles_again(tmp_path, monkeypatch):
    # gcc reports a full disk in its output, which Inductor raises as a CppCompileError, not an OSError (seen in
    # CI on the 256k tmpfs above, whose filling point depends on how much Inductor wrote before)
    from torch._inductor.exc import CppCompileError
    from vgc.cache.store import ArtifactStore

    root = tmp_path / "root"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor_cache"))
    store = ArtifactStore(root / "entry" / "rank_0_0", "binary", kernel_root=root)
    attempts = []

    def compile_fn():
        attempts.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        if len(attempts) == 1:
            raise RuntimeError("compile failed") from CppCompileError(
                ["g++", "k.cpp"], "/usr/bin/ld: final link failed: No space left on device\ncollect2: error")
        return "kernel"

    assert store.load_or_compile("piece", compile_fn, {}).artifact == "kernel"
    assert len(attempts) == 2 and not attempts[1].startswith(str(root)), attempts
    assert store.saving is False   # nothing more is written to that disk by this start


def test_a_compile_error_that_is_not_about_the_disk_is_raised_unchanged(tmp_path):
    from vgc.cache.store import ArtifactStore

    root = tmp_path / "root"
    store = ArtifactStore(root / "entry" / "rank_0_0", "binary", kernel_root=root)

    def compile_fn():
        raise ValueError("the model's own lowering error")

    with pytest.raises(ValueError, match="own lowering error"):
        store.load_or_compile("piece", compile_fn, {})


def test_trust_refuses_a_writable_or_foreign_directory_unless_told_otherwise(tmp_path, monkeypatch):
    from vgc.cache import entry, layout

    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    if os.getuid() == 0:   # only root can give a directory away
        os.chown(foreign, 12345, 12345)
    assert layout.untrusted_reason(own) is None and layout.untrusted_reason(tmp_path / "absent") is None
    assert layout.untrusted_reason(shared) == "is writable by its group (mode 775)"
    if os.getuid() == 0:
        assert layout.untrusted_reason(foreign) == "is owned by uid 12345, not by this user (uid 0)"
    monkeypatch.setenv("VGC_CACHE_TRUST", "any")
    assert entry._trust_problem([shared, foreign]) is None
    monkeypatch.setenv("VGC_CACHE_TRUST", "everyone")
    with pytest.raises(ValueError, match="VGC_CACHE_TRUST='everyone' is not a trust level; use 'any'"):
        entry._trust_problem([own])


def test_a_cache_root_that_is_a_file_names_the_fix_that_helps(tmp_path, monkeypatch, caplog):
    """No trust setting helps a root that is a file, so the warning does not suggest one."""
    import vgc
    from vgc.cache import entry

    monkeypatch.delenv("VGC_CACHE_TRUST", raising=False)
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    with caplog.at_level(logging.WARNING, logger="vgc"):
        assert entry.open_root(vgc.CompilationConfig(cache_dir=str(afile))) is None
    (message,) = [r.getMessage() for r in caplog.records if "compile cache off" in r.getMessage()]
    assert f"{afile} is not a directory" in message and "point the cache root" in message
    assert "VGC_CACHE_TRUST" not in message
