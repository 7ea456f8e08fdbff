"""A campaign of damaged and hostile cache bundles (issue 51): each is checked by `vgc cache verify FILE`, unpacked
by `vgc cache unpack FILE` into a fresh root, and the tiny decoder is then started from that root in a fresh process
and compared with eager.

    python tools/bundle_campaign.py                         # every case, seed 5106, 2 at a time (~8 min on 2 cores)
    python tools/bundle_campaign.py --seed 7 --jobs 1       # another seed, one case at a time
    python tools/bundle_campaign.py --only swap --keep /tmp/c   # cases whose name holds "swap"; keep their files
    python tools/bundle_campaign.py --out FILE --json FILE  # the table (default: benchmarks/results/issue51-
                                                            # 2026-12-06/bundle_campaign.txt) and every outcome

One real bundle is made first: the tiny reference decoder (`vgc.models.llama.tiny_config()`) compiled through
`vgc.compile` on the CPU under two configs (two entries: no compile sizes, and `compile_sizes=[16]`) in a fresh
process with its Inductor cache under the root, as in production, then `vgc cache pack`. Each variant is made from
it with a seeded RNG (which member, which byte, where to cut): cuts, byte flips in the archive and in members,
members swapped between the two entries (with and without the manifest's hashes recomputed), manifest edits
(wrong hashes and sizes, huge sizes, hostile entry and file names, deep nesting, malformed values), links,
devices, directories and duplicate members, missing and extra members, entries and rank directories, other
environments, and "forged" bundles whose entry records (index.json, kernels.json) were recomputed over the damage
too.

Per case: `vgc cache verify FILE`, then `vgc cache --root ROOT unpack FILE` (a fresh, absent root under the case's
directory), both in one fresh process through the `vgc` command's entry point (`vgc.shells.cli.main`), each with its own
output and exit status; then a fresh process starts the model from that root and compares each output with eager
(`torch.allclose`, atol = rtol = 2e-5: fp32 on the CPU, Inductor reorders reductions) at 1, 3, 16 and 21 tokens. A
root with an installed entry is started under both configs with the root's own Inductor cache (the bundle's
kernels, as in production), twice (the second start must be quiet: no warning, nothing corrupt), then checked by
`vgc cache verify`; a root where nothing was installed is started cold under the first config (the second's cold
path is the same code), against one warm Inductor cache directory shared by those starts (it holds nothing of any
variant's). Every process imports a copy of vgc made when the campaign starts (`snapshot`). Counted:

  crash         a Python traceback, or an exit status other than 0 and the documented refusal 1 (`verify`: the
                bundle is bad; `unpack`: refused, nothing installed); 2 counts too (the root's problem: a fresh
                root has none); a start that exits non-zero or reports nothing
  wrong answer  a start whose output is not allclose to eager's
  mismatch      `verify` and `unpack` disagree, or the verdict is not the one the case expects (refuse / accept)
  persistent    the second start after an accepted bundle still warns or counts something corrupt
  escape        anything written in the case's directory outside the root (hostile names aim there)

The forged cases are counted apart: a bundle whose every record was recomputed over its damage is what a bundle
packed from other code looks like, which content hashes cannot tell (docs/cache.md, Trust). Exit status 1 when any
of the five counts of the other cases is non-zero.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "issue51-2026-12-06" / "bundle_campaign.txt"
CONFIGS = {"A": {}, "B": {"compile_sizes": [16]}}   # two entries of one model
SIZES = (1, 3, 16, 21)
TOL = dict(atol=2e-5, rtol=2e-5)
TRACEBACK = "Traceback (most recent call last)"
SOURCE: list[Path] = []   # the copy of vgc every process imports (set by main)
CACHE = "torch_compile_cache"
KERNELS = "inductor_cache"


# ---- the fresh process that starts the model ----
def start(reference: str | None, save_reference: str | None, configs: str) -> int:
    """Compile the tiny decoder under each of `configs` (names in CONFIGS) from VGC_CACHE_ROOT, compare with eager,
    print a JSON line."""
    import logging

    import torch

    import vgc
    from vgc.models import llama

    class Recorder(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    recorder = Recorder()
    logging.getLogger("vgc").addHandler(recorder)
    cfg = llama.tiny_config()
    wanted = torch.load(reference) if reference else None
    report: dict[str, Any] = {"configs": {}}
    outputs: dict[str, dict[int, Any]] = {}
    for name in configs:
        config = CONFIGS[name]
        before = vgc.counters.as_dict()
        model = llama.Llama(cfg)
        compiled = vgc.compile(model, config=config)
        compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill"))
        close, max_diff, equal, outputs[name] = True, 0.0, True, {}
        with torch.no_grad():
            for n in SIZES:
                eager = model(**llama.make_batch(cfg, n, "prefill"))
                out = compiled(**llama.make_batch(cfg, n, "prefill"))
                close &= bool(torch.allclose(out, eager, **TOL))
                max_diff = max(max_diff, (out - eager).abs().max().item())
                equal &= wanted is None or bool(torch.equal(out, wanted[name][n]))
                outputs[name][n] = out.clone()
        after = vgc.counters.as_dict()
        report["configs"][name] = {"close": close, "max_diff": max_diff, "equal_to_packer": equal,
                                   "trace_source": compiled.trace_source,
                                   "counters": {k: after[k] - before[k] for k in after if after[k] != before[k]}}
    if save_reference:
        torch.save(outputs, save_reference)
    report["warnings"] = recorder.messages
    report["vgc"] = vgc.__file__
    print(json.dumps(report))
    return 0


# ---- the process that runs the two commands ----
def commands(bundle: str, root: str) -> int:
    """`vgc cache verify BUNDLE`, then `vgc cache --root ROOT unpack BUNDLE`, each through the `vgc` command's entry
    point (`vgc.shells.cli.main`) with its own output and exit status; one process for both saves an import of torch and
    vgc per case. An exception that escapes a command is its traceback (a crash). Prints a JSON line."""
    import contextlib
    import logging
    import traceback

    from vgc.shells.cli import main as vgc_main

    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)   # the root handler the command's basicConfig would add, into the buffer
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    report = {}
    for name, argv in (("verify", ["cache", "verify", bundle]),
                       ("unpack", ["cache", "--root", root, "unpack", bundle])):
        buffer.seek(0)
        buffer.truncate()
        began = time.perf_counter()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                rc = vgc_main(argv)
            except SystemExit as stop:
                rc = stop.code if isinstance(stop.code, int) else 1
            except BaseException:   # noqa: B036 -- what a command lets escape is what the campaign counts
                traceback.print_exc()
                rc = 1
        report[name] = {"rc": rc, "out": buffer.getvalue(), "seconds": time.perf_counter() - began}
    print(json.dumps(report))
    return 0


# ---- commands ----
@dataclasses.dataclass
class Ran:
    rc: int
    out: str
    seconds: float

    @property
    def traceback(self) -> bool:
        return TRACEBACK in self.out


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> Ran:
    began = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                              errors="replace")
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        rc, out = 124, f"timed out after {timeout} s: {error}"
    return Ran(rc, out, time.perf_counter() - began)


def _env(root: Path | None = None, inductor: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "VGC_CACHE_ROOT")}
    for var in ("VGC_DISABLE_COMPILE_CACHE", "VLLM_DISABLE_COMPILE_CACHE"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(p) for p in SOURCE] + [env.get("PYTHONPATH")]))
    if root is not None:
        env["VGC_CACHE_ROOT"] = str(root)
    if inductor is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    return env


def _vgc(*args: str) -> list[str]:
    return [sys.executable, "-m", "vgc", *args]


def _start_command(reference: Path | None = None, save: Path | None = None, configs: str = "AB") -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--start", "--configs", configs]
    if reference:
        argv += ["--reference", str(reference)]
    if save:
        argv += ["--save-reference", str(save)]
    return argv


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


# ---- the real bundle ----
def snapshot(work: Path) -> str:
    """A copy of vgc for every process of the campaign: the committed tree (HEAD) with the working tree's
    vgc/cache/ over it. vgc's own sources are a factor of every entry's key, so an edit elsewhere in vgc/ while
    the campaign runs (another session's) would make the base bundle foreign halfway through."""
    source = work / "src"
    if not (source / "vgc").is_dir():
        source.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "vgc"], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(source, filter="data")
        for path in (REPO / "vgc" / "cache").glob("*.py"):
            shutil.copy2(path, source / "vgc" / "cache" / path.name)
    SOURCE[:] = [source]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "vgc/cache"],
                           capture_output=True, text=True).stdout.strip()
    return f"vgc at {head}" + (" with the working tree's vgc/cache (uncommitted changes)" if dirty else "")



def build_base(work: Path) -> tuple[Path, Path, Path]:
    """(bundle, reference outputs, warm Inductor cache for cold starts)."""
    root, reference, bundle = work / "base-root", work / "reference.pt", work / "base.vgcb"
    ran = _run(_start_command(save=reference), work, _env(root))
    report = _last_json(ran.out)
    if ran.rc != 0 or report is None or not all(c["close"] for c in report["configs"].values()):
        raise SystemExit(f"the base compile failed (rc {ran.rc}):\n{ran.out[-4000:]}")
    if not report["vgc"].startswith(str(SOURCE[0])):
        raise SystemExit(f"the base compile imported vgc from {report['vgc']}, not from the copy {SOURCE[0]}")
    packed = _run(_vgc("cache", "--root", str(root), "pack", "-o", str(bundle)), work, _env())
    if packed.rc != 0:
        raise SystemExit(f"pack failed:\n{packed.out}")
    shared = work / "shared-inductor"
    shutil.copytree(root / KERNELS, shared, symlinks=True)
    return bundle, reference, shared


# ---- bundles as data ----
Member = tuple[tarfile.TarInfo, bytes]


def read_bundle(path: Path) -> tuple[dict, list[Member]]:
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    return json.loads(members[0][1]), members[1:]


def rehash(manifest: dict, members: list[Member]) -> dict:
    manifest["files"] = {m.name: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                         for m, d in members if m.isreg()}
    return manifest


def tar_bytes(manifest: dict | bytes, members: list[Member], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    text = manifest if isinstance(manifest, bytes) else json.dumps(manifest, indent=1, sort_keys=True).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        for member, data in members:
            info = tarfile.TarInfo(member.name)
            info.type, info.linkname, info.mode = member.type, member.linkname, 0o600
            info.devmajor, info.devminor = member.devmajor, member.devminor
            info.size = len(data) if member.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if member.isreg() else None)
    return raw.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def renamed(info: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    info = copy.copy(info)
    info.name = name
    return info


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


@dataclasses.dataclass
class Case:
    name: str
    category: str
    expect: str                    # "refuse", "accept" or "either"
    make: Callable[[Path], Path]   # writes the variant under the case directory, returns its path


class Variants:
    """The base bundle's parts, and the helpers the variants are made with."""

    def __init__(self, bundle: Path, rng: random.Random):
        self.raw = bundle.read_bytes()
        self.rng = rng
        self.manifest, self.members = read_bundle(bundle)
        by_sizes = {json.dumps(e["factors"]["config"].get("compile_sizes")): h for h, e in
                    self.manifest["entries"].items()}
        self.a, self.b = by_sizes["[]"], by_sizes["[16]"]
        with tarfile.open(bundle) as tar:
            self.layout = [(m.offset, m.offset_data, m.size) for m in tar]
            self.end = tar.offset   # where the end-of-archive blocks start

    def fresh(self) -> tuple[dict, list[Member]]:
        return copy.deepcopy(self.manifest), [(copy.copy(m), d) for m, d in self.members]

    def rank(self, entry: str) -> str:
        return f"{CACHE}/{entry}/rank_0_0"

    def find(self, members: list[Member], test: Callable[[str], bool], pick: bool = True) -> int:
        found = [i for i, (m, _) in enumerate(members) if test(m.name)]
        if not found:
            raise LookupError("no such member in the base bundle")
        return self.rng.choice(found) if pick else found[0]

    def kind(self, what: str, entry: str | None = None) -> Callable[[str], bool]:
        entry = entry or self.a
        rank = self.rank(entry) + "/"
        return {
            "artifact": lambda n: n.startswith(rank + "artifacts/"),
            "index": lambda n: n == rank + "index.json",
            "kernels.json": lambda n: n == rank + "kernels.json",
            "trace": lambda n: n.startswith(rank + "trace-"),
            "factors": lambda n: n == rank + "cache_key_factors.json",
            "debug file": lambda n: n.startswith(rank) and n.endswith(".py"),
            "kernel .so": lambda n: n.startswith(KERNELS + "/") and n.endswith(".main.so"),
            "kernel .py": lambda n: n.startswith(KERNELS + "/") and n.endswith(".py") and "/fxgraph/" not in n,
            "kernel .cpp": lambda n: n.startswith(KERNELS + "/") and n.endswith(".main.cpp"),
            "probe .so": lambda n: n.startswith(KERNELS + "/") and n.endswith(".so") and ".main." not in n,
            "fxgraph pickle": lambda n: n.startswith(KERNELS + "/fxgraph/"),
            "aotautograd pickle": lambda n: n.startswith(KERNELS + "/aotautograd/"),
        }[what]

    def other(self, name: str) -> str:
        """The same file in the other entry."""
        return name.replace(f"/{self.a}/", f"/{self.b}/") if f"/{self.a}/" in name else \
            name.replace(f"/{self.b}/", f"/{self.a}/")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def cases(v: Variants) -> list[Case]:
    rng = v.rng
    out: list[Case] = []

    def add(name: str, category: str, expect: str, make: Callable[[Path], Path]) -> None:
        out.append(Case(name, category, expect, make))

    def bundle(manifest, members, *, recompute: bool, fmt: int = tarfile.PAX_FORMAT) -> Callable[[Path], Path]:
        if recompute:
            rehash(manifest, members)
        data = tar_bytes(manifest, members, fmt)
        return lambda d: _write(d / "bundle.vgcb", data)

    def raw(data: bytes, name: str = "bundle.vgcb") -> Callable[[Path], Path]:
        return lambda d: _write(d / name, data)

    # -- the intact bundle: the control --
    add("intact bundle (control)", "control", "accept", raw(v.raw))

    # -- the archive --
    for _ in range(2):
        at = rng.randrange(2048, len(v.raw) - 2048)
        add(f"cut at byte {at} of {len(v.raw)}", "archive", "refuse", raw(v.raw[:at]))
    for offset, _, _ in rng.sample(v.layout[1:], 1):
        add(f"cut at the member boundary {offset}", "archive", "refuse", raw(v.raw[:offset]))
    for _ in range(2):
        at = rng.randrange(0, len(v.raw))
        inside = any(start <= at < data + size for start, data, size in v.layout)
        add(f"archive byte {at} flipped ({'in a member' if inside else 'in padding or the end blocks'})",
            "archive", "refuse" if inside else "either", raw(flip(v.raw, at)))
    add("4 KiB of random bytes", "archive", "refuse", raw(rng.randbytes(4096)))
    add("an empty file", "archive", "refuse", raw(b""))
    add("a directory in place of the file", "archive", "refuse",
        lambda d: (d / "bundle.vgcb").mkdir() or d / "bundle.vgcb")
    add("the bundle gzip-compressed", "archive", "refuse", raw(gzip.compress(v.raw, mtime=0)))
    add("random bytes after the end of the archive", "archive", "either", raw(v.raw + rng.randbytes(3000)))
    m, ms = v.fresh()
    first = tar_bytes(m, ms)
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:   # the manifest moved to the end
        members = [(x, tar.extractfile(x).read()) for x in tar.getmembers()]
    moved = io.BytesIO()
    with tarfile.open(fileobj=moved, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members[1:] + members[:1]:
            tar.addfile(info, io.BytesIO(data))
    add("the manifest last instead of first", "archive", "refuse", raw(moved.getvalue()))

    # -- a member damaged, the manifest as packed --
    for what in ("artifact", "kernel .so", "index", "kernels.json", "trace"):
        m, ms = v.fresh()
        i = v.find(ms, v.kind(what))
        at = rng.randrange(len(ms[i][1]))
        ms[i] = (ms[i][0], flip(ms[i][1], at))
        add(f"{what} byte {at} flipped", "member", "refuse", bundle(m, ms, recompute=False))
    for what in ("artifact",):
        m, ms = v.fresh()
        i = v.find(ms, v.kind(what))
        cut = rng.randrange(1, len(ms[i][1]))
        ms[i] = (ms[i][0], ms[i][1][:cut])
        add(f"{what} cut to {cut} bytes", "member", "refuse", bundle(m, ms, recompute=False))

    # -- the same file of the two entries swapped --
    for what, recomputed in (("index", (False, True)), ("trace", (True,)), ("factors", (True,)),
                             ("artifact", (True,))):
        for recompute in recomputed:
            m, ms = v.fresh()
            i = v.find(ms, v.kind(what, v.a))
            j = next((k for k, (x, _) in enumerate(ms) if x.name == v.other(ms[i][0].name)), None)
            if j is None:
                continue
            same = ms[i][1] == ms[j][1]
            ms[i], ms[j] = (ms[i][0], ms[j][1]), (ms[j][0], ms[i][1])
            expect = "accept" if same else ("either" if what == "kernels.json" and recompute else "refuse")
            add(f"{what} swapped between the entries{', hashes recomputed' if recompute else ''}"
                f"{' (identical bytes)' if same else ''}", "swap", expect, bundle(m, ms, recompute=recompute))
    m, ms = v.fresh()   # the two entries' directories exchanged, their manifest records too
    swapped = [(renamed(x, v.other(x.name)), d) if x.name.startswith(CACHE + "/") else (x, d) for x, d in ms]
    m["entries"] = {v.a: m["entries"][v.b], v.b: m["entries"][v.a]}
    add("the two entries' directories exchanged, hashes recomputed", "swap", "refuse",
        bundle(m, swapped, recompute=True))
    m, ms = v.fresh()   # ... and each factors file's "hash" edited to the name it now lies under
    swapped = []
    for x, d in ms:
        if x.name.startswith(CACHE + "/"):
            x = renamed(x, v.other(x.name))
            if x.name.endswith("/cache_key_factors.json"):
                stored = json.loads(d)
                stored["hash"] = x.name.split("/")[1]
                d = json.dumps(stored).encode()
        swapped.append((x, d))
    m["entries"] = {v.a: m["entries"][v.b], v.b: m["entries"][v.a]}
    for entry_hash, entry in m["entries"].items():
        entry["factors"] = next(json.loads(d)["factors"] for x, d in swapped
                                if x.name == f"{v.rank(entry_hash)}/cache_key_factors.json")
    add("the two entries exchanged, their factors' hashes edited to match", "swap", "refuse",
        bundle(m, swapped, recompute=True))
    for what in ("kernel .so", "kernel .py"):
        m, ms = v.fresh()
        first, second = rng.sample([k for k, (x, _) in enumerate(ms) if v.kind(what)(x.name)], 2)
        ms[first], ms[second] = (ms[first][0], ms[second][1]), (ms[second][0], ms[first][1])
        add(f"two {what} files swapped, hashes recomputed", "swap", "refuse", bundle(m, ms, recompute=True))

    # -- damage behind recomputed manifest hashes --
    for what, expect in (("artifact", "refuse"), ("trace", "refuse"), ("kernel .cpp", "refuse"),
                         ("debug file", "accept"), ("fxgraph pickle", "accept"), ("probe .so", "either")):
        m, ms = v.fresh()
        i = v.find(ms, v.kind(what))
        at = rng.randrange(len(ms[i][1]))
        ms[i] = (ms[i][0], flip(ms[i][1], at))
        add(f"{what} byte {at} flipped, hashes recomputed", "recomputed", expect, bundle(m, ms, recompute=True))
    m, ms = v.fresh()
    i = v.find(ms, v.kind("index"))
    index = json.loads(ms[i][1])
    first, second = rng.sample(sorted(index), 2)
    index[first]["sha256"], index[second]["sha256"] = index[second]["sha256"], index[first]["sha256"]
    ms[i] = (ms[i][0], json.dumps(index).encode())
    add("two index records' hashes exchanged, hashes recomputed", "recomputed", "refuse",
        bundle(m, ms, recompute=True))

    # -- the manifest edited --
    def edited(label: str, change: Callable[[dict], Any], expect: str = "refuse") -> None:
        m, ms = v.fresh()
        change(m)
        add(label, "manifest", expect, bundle(m, ms, recompute=False))

    def a_file(m: dict) -> dict:
        return m["files"][rng.choice(sorted(m["files"]))]

    edited("a file's sha256 wrong", lambda m: a_file(m).update(sha256=f"{rng.getrandbits(256):064x}"))
    edited("a file's size 2**62", lambda m: a_file(m).update(size=1 << 62))
    edited("a file left out of the manifest", lambda m: m["files"].pop(rng.choice(sorted(m["files"]))))
    edited("a file listed that the archive lacks", lambda m: m["files"].update(
        {f"{KERNELS}/zz/czz{rng.getrandbits(64):016x}.py": {"size": 3, "sha256": "0" * 64}}))
    edited("version 2", lambda m: m.update(version=2))
    edited("no entries", lambda m: m.update(entries={}))
    edited("a rank rank_0_0/../x", lambda m: m["entries"][v.a].update(ranks=["rank_0_0/../x"]))
    edited("the manifest's factors disagree with the entry's", lambda m: m["entries"][v.a]["factors"][
        "environment"].update(torch_version="2.99.0"))
    edited("10,001 entries", lambda m: m["entries"].update(
        {f"{k:020x}": {"factors": {}, "ranks": ["rank_0_0"]} for k in range(10_001)}))
    m, ms = v.fresh()
    nested: dict = {}
    for _ in range(20):
        nested = {"x": nested}
    m["entries"][v.a]["factors"]["config"]["inductor_compile_config"] = nested
    add("factors nested 20 deep", "manifest", "refuse", bundle(m, ms, recompute=False))
    m, ms = v.fresh()
    deep = (b'{"format": "vgc-cache-bundle", "version": 1, "files": {}, "entries": ' + b"[" * 5000 + b"]" * 5000
            + b"}")
    add("manifest nested 5000 deep", "manifest", "refuse", bundle(deep, ms, recompute=False))
    text = json.dumps(m).encode()
    add("manifest not UTF-8", "manifest", "refuse", bundle(b"\xff\xfe" + text, ms, recompute=False))
    name = rng.choice(sorted(m["files"]))
    listed = json.dumps({name: m["files"][name]}).encode()[1:-1]   # its record as the manifest text has it
    size = f'"size": {m["files"][name]["size"]}'.encode()
    for label, value in (("a size of 5001 digits", b"1" + b"0" * 5000),):
        changed = text.replace(listed, listed.replace(size, b'"size": ' + value))
        assert changed != text
        add(label, "manifest", "refuse", bundle(changed, ms, recompute=False))
    twice = text.replace(listed, listed + f', "{name}": {{"sha256": "{"0" * 64}", "size": 1}}'.encode())
    assert twice != text
    add("a file listed twice (JSON duplicate keys, the second wrong)", "manifest", "refuse",
        bundle(twice, ms, recompute=False))
    header = tarfile.TarInfo("manifest.json")
    header.size = 100 << 20
    add("the manifest's header says 100 MiB", "manifest", "refuse",
        raw(header.tobuf(tarfile.PAX_FORMAT) + v.raw[v.layout[0][1]:]))

    # -- hostile names (manifest and member agree; hashes recomputed) --
    def rename_entry(label: str, new: str) -> None:
        m, ms = v.fresh()
        m["entries"] = {(new if k == v.a else k): e for k, e in m["entries"].items()}
        prefix = f"{CACHE}/{v.a}/"
        ms = [(renamed(x, f"{CACHE}/{new}/{x.name[len(prefix):]}") if x.name.startswith(prefix) else x, d)
              for x, d in ms]
        add(label, "names", "refuse", bundle(m, ms, recompute=True))

    rename_entry("entry named ab/cd", "ab/cd")
    rename_entry("entry named ..", "..")

    def escaping(d: Path) -> list[tuple[str, bytes]]:
        return [(f"{CACHE}/{v.a}/rank_0_0/../../../../escaped-dotdot.py", b"x = 1\n"),
                (str(d / "escaped-absolute.py"), b"x = 1\n"), ("../escaped-up.py", b"x = 1\n")]

    def planted(pick: int, label: str) -> None:
        def make(d: Path) -> Path:
            m, ms = v.fresh()
            name, data = escaping(d)[pick]
            return _write(d / "bundle.vgcb", tar_bytes(rehash(m, ms + [(member(name), data)]), ms + [
                (member(name), data)]))
        add(label, "names", "refuse", make)

    planted(0, "a file rank_0_0/../../../../escaped-dotdot.py")
    planted(1, "a file at an absolute path")
    planted(2, "a file ../escaped-up.py")

    def extra_file(label: str, name: str, data: bytes = b"x", expect: str = "refuse") -> None:
        m, ms = v.fresh()
        ms.append((member(name), data))
        add(label, "names", expect, bundle(m, ms, recompute=True))

    extra_file("a file name with a backslash", f"{KERNELS}/ab\\..\\..\\x.py")
    extra_file("a file name 5000 characters long", f"{KERNELS}/" + "a" * 5000)
    extra_file("a file name 100 directories deep", f"{KERNELS}/" + "d/" * 100 + "k.py")
    extra_file("a file name a//b", f"{KERNELS}/ab//k.py")
    extra_file("a file under a file", f"{v.rank(v.a)}/index.json/planted")
    extra_file("a long (PAX) name going ../ 40 times", "../" * 40 + "pax-escape.py")

    # -- links, devices, directories and duplicates --
    def odd(label: str, info: tarfile.TarInfo, listed: bool = True) -> None:
        m, ms = v.fresh()
        ms.append((info, b""))
        rehash(m, ms)
        if listed:
            m["files"][info.name] = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
        add(label, "links", "refuse", bundle(m, ms, recompute=False))

    odd("a symlink to /etc/passwd", member(f"{KERNELS}/zz/czz.py", tarfile.SYMTYPE, "/etc/passwd"))
    odd("a hard link to a listed file", member(f"{KERNELS}/zz/czz.py", tarfile.LNKTYPE,
                                                next(x.name for x, _ in v.members if v.kind("kernel .py")(x.name))))
    odd("a directory member", member(f"{KERNELS}/zz", tarfile.DIRTYPE), listed=False)
    odd("a FIFO", member(f"{KERNELS}/zz/fifo", tarfile.FIFOTYPE))
    m, ms = v.fresh()
    i = v.find(ms, v.kind("kernel .py"))
    ms.append((ms[i][0], b"print('the second copy')\n"))
    add("a member twice, the second other bytes", "links", "refuse", bundle(m, ms, recompute=False))
    header = tarfile.TarInfo(f"{KERNELS}/zz/huge.so")
    header.size = 8 << 30
    add("a member whose header says 8 GiB (the archive ends)", "links", "refuse",
        raw(v.raw[:v.end] + header.tobuf(tarfile.PAX_FORMAT) + b"\x7fELF" + bytes(4000)))

    # -- missing and extra, consistently (hashes recomputed) --
    def dropped(label: str, test: Callable[[str], bool], expect: str) -> None:
        m, ms = v.fresh()
        ms = [(x, d) for x, d in ms if not test(x.name)]
        add(label, "missing", expect, bundle(m, ms, recompute=True))

    one = rng.choice([x.name for x, _ in v.members if v.kind("artifact")(x.name)])
    dropped("an artifact left out", lambda n: n == one, "refuse")
    dropped("index.json left out", v.kind("index"), "refuse")
    dropped("cache_key_factors.json left out", v.kind("factors"), "refuse")
    dropped("kernels.json left out", v.kind("kernels.json"), "accept")
    dropped("the saved trace left out", v.kind("trace"), "accept")
    kernel = rng.choice([x.name for x, _ in v.members if v.kind("kernel .so")(x.name)])
    dropped("a compiled kernel left out", lambda n: n == kernel, "accept")
    dropped("every kernel left out (as --no-kernels)", lambda n: n.startswith(KERNELS + "/"), "accept")
    m, ms = v.fresh()   # an extra entry: a copy of A under another name
    extra = f"{rng.getrandbits(80):020x}"
    ms += [(renamed(x, x.name.replace(f"/{v.a}/", f"/{extra}/")), d) for x, d in ms if f"/{v.a}/" in x.name]
    m["entries"][extra] = copy.deepcopy(m["entries"][v.a])
    add("an extra entry: a copy of another under a new name", "extra", "refuse", bundle(m, ms, recompute=True))
    m, ms = v.fresh()   # ... only its factors file, its hash edited: a consistent stray entry no start uses
    i = v.find(ms, v.kind("factors"))
    stored = json.loads(ms[i][1])
    stored["hash"] = extra
    ms.append((member(f"{CACHE}/{extra}/rank_0_0/cache_key_factors.json"), json.dumps(stored).encode()))
    m["entries"][extra] = {"factors": stored["factors"], "ranks": ["rank_0_0"]}
    add("an extra entry of a factors file alone (a stray)", "extra", "accept", bundle(m, ms, recompute=True))
    m, ms = v.fresh()   # a second rank directory, a copy of the first
    ms += [(renamed(x, x.name.replace("/rank_0_0/", "/rank_1_0/")), d) for x, d in ms if
           x.name.startswith(v.rank(v.a) + "/")]
    m["entries"][v.a]["ranks"].append("rank_1_0")
    add("an extra rank directory, a copy of rank_0_0", "extra", "refuse", bundle(m, ms, recompute=True))
    m, ms = v.fresh()
    ms += [(member(f"{KERNELS}/zz/czz{k:04d}.py"), f"x = {k}\n".encode()) for k in range(300)]
    add("300 junk files under inductor_cache", "extra", "accept", bundle(m, ms, recompute=True))
    m, ms = v.fresh()
    ms.append((member(f"{KERNELS}/zz/czzhuge.bin"), bytes(32 << 20)))
    add("a 32 MiB junk file under inductor_cache", "extra", "accept", bundle(m, ms, recompute=True))

    # -- another environment (manifest and factors file agree) --
    def environment(label: str, **changes) -> None:
        m, ms = v.fresh()
        m["entries"][v.a]["factors"]["environment"].update(changes)
        i = v.find(ms, v.kind("factors"))
        stored = json.loads(ms[i][1])
        stored["factors"]["environment"].update(changes)
        ms[i] = (ms[i][0], json.dumps(stored).encode())
        add(label, "environment", "refuse", bundle(m, ms, recompute=True))

    environment("a foreign torch version (2.99.0)", torch_version="2.99.0")
    environment("a foreign CPU ISA", cpu_vec_isa="avx512_bf16_amx")
    environment("a CUDA bundle", device_type="cuda", device_name="NVIDIA H200", device_capability="9.0")

    # -- forged: the entry's own records recomputed over the damage too --
    m, ms = v.fresh()
    i = v.find(ms, v.kind("artifact"))
    at = rng.randrange(len(ms[i][1]))
    ms[i] = (ms[i][0], flip(ms[i][1], at))
    j = v.find(ms, v.kind("index"))
    index = json.loads(ms[j][1])
    (record,) = [r for r in index.values() if ms[i][0].name.endswith("/" + r["file"])]
    record.update(sha256=hashlib.sha256(ms[i][1]).hexdigest(), bytes=len(ms[i][1]))
    ms[j] = (ms[j][0], json.dumps(index).encode())
    add(f"forged: artifact byte {at} flipped, its index record and the manifest recomputed", "forged", "accept",
        bundle(m, ms, recompute=True))
    m, ms = v.fresh()
    first, second = rng.sample([k for k, (x, _) in enumerate(ms) if v.kind("kernel .py")(x.name)], 2)
    ms[first], ms[second] = (ms[first][0], ms[second][1]), (ms[second][0], ms[first][1])
    for k, (x, d) in enumerate(ms):
        if x.name.endswith("/kernels.json"):
            record = json.loads(d)
            for moved in (ms[first], ms[second]):
                relative = moved[0].name[len(KERNELS) + 1:]
                if relative in record:
                    record[relative] = hashlib.sha256(moved[1]).hexdigest()
            ms[k] = (x, json.dumps(record).encode())
    add("forged: two kernel .py swapped, kernels.json and the manifest recomputed", "forged", "either",
        bundle(m, ms, recompute=True))
    return out


# ---- one case ----
def _said(ran: Ran) -> str:
    """What a command said, in one short line: its first problem (without the bundle's path), else its last line."""
    lines = [line for line in ran.out.strip().splitlines() if line.strip()]
    bad = next((line for line in lines if line.startswith(("BAD ", "vgc cache"))), None)
    if bad is None:
        return (lines[-1] if lines else "")[:120]
    return (bad.split(": ", 1)[1] if ": " in bad else bad)[:120]


def run_case(number: int, case: Case, work: Path, reference: Path, shared: Path) -> dict:
    directory = work / "cases" / f"{number:03d}"
    directory.mkdir(parents=True)
    path = case.make(directory)
    root = directory / "root"
    outcome: dict[str, Any] = {"number": number, "case": case.name, "category": case.category, "expect": case.expect}
    began = time.perf_counter()
    ran = _run([sys.executable, str(Path(__file__).resolve()), "--commands", str(path), str(root)], directory,
               _env(root))
    said = _last_json(ran.out)
    if said is None:   # the process itself died: both commands count as crashed
        verify = unpack = Ran(ran.rc or 1, ran.out + TRACEBACK, ran.seconds)
    else:
        verify, unpack = (Ran(said[k]["rc"], said[k]["out"], said[k]["seconds"]) for k in ("verify", "unpack"))
    installed = sorted(p.name for p in (root / CACHE).iterdir()) if (root / CACHE).is_dir() else []
    if installed:   # the root's own Inductor cache: the bundle's kernels, as in production
        starts = [_run(_start_command(reference), directory, _env(root))]
    else:   # nothing of the bundle's there: a cold start (one config: the other's would only repeat its path),
        # against the shared warm Inductor cache
        starts = [_run(_start_command(reference, configs="A"), directory, _env(root, shared))]
    if installed:
        starts.append(_run(_start_command(reference), directory, _env(root)))
    root_verify = _run(_vgc("cache", "--root", str(root), "verify"), directory, _env(root)) if installed else None
    left = sorted(p.name for p in directory.iterdir() if p.name not in (path.name, "root"))
    reports = [_last_json(s.out) for s in starts]
    outcome.update(
        verify_rc=verify.rc, verify_said=_said(verify), unpack_rc=unpack.rc, unpack_said=_said(unpack),
        installed=installed, escaped=left,
        crashes=[what for what, ran in (("verify", verify), ("unpack", unpack))
                 if ran.traceback or ran.rc not in (0, 1)]
        + [f"start {k + 1}" for k, s in enumerate(starts) if s.rc != 0 or reports[k] is None],
        logged_tracebacks=[f"start {k + 1}" for k, s in enumerate(starts) if s.traceback and s.rc == 0],
        starts=[{"rc": s.rc, "seconds": round(s.seconds, 1), "report": r,
                 "tail": s.out[-3000:] if s.rc != 0 or r is None else ""} for s, r in zip(starts, reports)],
        root_verify_rc=root_verify.rc if root_verify else None,
        root_verify_said=_said(root_verify) if root_verify and root_verify.rc else "",
        seconds=round(time.perf_counter() - began, 1))
    wrong = [f"start {k + 1} {name} (max diff {c['max_diff']:.2e})" for k, r in enumerate(reports) if r
             for name, c in r["configs"].items() if not c["close"]]
    verdict = {0: "accept", 1: "refuse"}
    mismatch = []
    if verify.rc in verdict and unpack.rc in verdict and verify.rc != unpack.rc:
        mismatch.append(f"verify {verdict[verify.rc]}s, unpack {verdict[unpack.rc]}s")
    if case.expect != "either" and unpack.rc in verdict and verdict[unpack.rc] != case.expect:
        mismatch.append(f"expected {case.expect}, got {verdict[unpack.rc]}")
    if unpack.rc == 1 and installed:
        mismatch.append("refused, yet something was installed")
    persistent = []
    if len(reports) > 1 and reports[1]:
        second = reports[1]
        corrupt = sum(c["counters"].get("cache_corrupt", 0) for c in second["configs"].values())
        if second["warnings"] or corrupt:
            persistent.append(f"{len(second['warnings'])} warnings, {corrupt} corrupt in the second start")
    outcome.update(wrong=wrong, mismatch=mismatch, persistent=persistent)
    return outcome


# ---- the table ----
def _start_said(outcome: dict) -> str:
    parts = []
    for k, start in enumerate(outcome["starts"]):
        r = start["report"]
        if r is None:
            parts.append(f"rc {start['rc']}")
            continue
        total = {}
        for c in r["configs"].values():
            for name, n in c["counters"].items():
                total[name] = total.get(name, 0) + n
        ok = "ok" if all(c["close"] for c in r["configs"].values()) else "WRONG"
        parts.append(f"{ok} {total.get('artifacts_loaded', 0)}L/{total.get('inductor_compiles', 0)}C"
                     f"{'/' + str(total['cache_corrupt']) + 'X' if total.get('cache_corrupt') else ''}"
                     f" {len(r['warnings'])}w")
    return "; ".join(parts)


def table(outcomes: list[dict], header: list[str]) -> str:
    lines = list(header)
    width = max(len(o["case"]) for o in outcomes)
    start = "start (L loaded / C compiled / X corrupt, w warnings; 2nd start)"
    lines.append(f"{'#':>3}  {'case':{width}}  {'expect':6}  {'verify':6}  {'unpack':6}  {start:44}  notes")
    for o in outcomes:
        verdict = {0: "accept", 1: "refuse"}
        notes = "; ".join(o["crashes"] + o["wrong"] + o["mismatch"] + o["persistent"] +
                          [f"escaped: {', '.join(o['escaped'])}"] * bool(o["escaped"]) +
                          [f"root verify rc {o['root_verify_rc']}: {o['root_verify_said']}"] *
                          bool(o["root_verify_rc"]))
        lines.append(f"{o['number']:>3}  {o['case']:{width}}  {o['expect']:6}  "
                     f"{verdict.get(o['verify_rc'], 'rc ' + str(o['verify_rc'])):6}  "
                     f"{verdict.get(o['unpack_rc'], 'rc ' + str(o['unpack_rc'])):6}  {_start_said(o):44}  {notes}")
    lines.append("")
    lines.append("what verify / unpack said (first problem or last line):")
    for o in outcomes:
        lines.append(f"{o['number']:>3}  verify: {o['verify_said']}")
        if o["unpack_said"] != o["verify_said"]:
            lines.append(f"{'':>3}  unpack: {o['unpack_said']}")
    return "\n".join(lines)


def summary(outcomes: list[dict]) -> dict[str, int]:
    counts = {"cases": len(outcomes),
              "damaged or hostile": sum(o["category"] not in ("control", "forged") for o in outcomes),
              "refused": sum(o["unpack_rc"] == 1 for o in outcomes),
              "accepted": sum(o["unpack_rc"] == 0 for o in outcomes),
              "crashes": sum(bool(o["crashes"]) for o in outcomes),
              "wrong answers": sum(bool(o["wrong"]) for o in outcomes),
              "mismatches": sum(bool(o["mismatch"]) for o in outcomes),
              "persistent": sum(bool(o["persistent"]) for o in outcomes),
              "escapes": sum(bool(o["escaped"]) for o in outcomes),
              "tracebacks logged by a start that ended well": sum(bool(o["logged_tracebacks"]) for o in outcomes),
              "root verify bad after the starts": sum(bool(o["root_verify_rc"]) for o in outcomes)}
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=5106)
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--only", help="run only the cases whose name holds this text")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the table goes ('-': only printed)")
    parser.add_argument("--json", help="write every outcome to this file")
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed); "
                        "a base bundle an earlier run kept there is used again")
    parser.add_argument("--list", action="store_true", help="list the cases, run none")
    parser.add_argument("--start", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    parser.add_argument("--save-reference", help=argparse.SUPPRESS)
    parser.add_argument("--configs", default="AB", help=argparse.SUPPRESS)
    parser.add_argument("--commands", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.start:
        return start(args.reference, args.save_reference, args.configs)
    if args.commands:
        return commands(*args.commands)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="vgc-bundle-campaign-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "cases", ignore_errors=True)
    began = time.perf_counter()
    try:
        source = snapshot(work)
        if (work / "base.vgcb").is_file() and (work / "reference.pt").is_file():   # a kept run's: reused
            bundle, reference, shared = work / "base.vgcb", work / "reference.pt", work / "shared-inductor"
        else:
            bundle, reference, shared = build_base(work)
        built = time.perf_counter() - began
        print(f"base bundle: {bundle.stat().st_size} bytes, built in {built:.0f} s", flush=True)
        chosen = [c for c in cases(Variants(bundle, random.Random(args.seed)))
                  if not args.only or args.only in c.name]
        if args.list:
            for number, case in enumerate(chosen, 1):
                print(f"{number:>3}  {case.category:11s} {case.expect:6s}  {case.name}")
            return 0
        outcomes: list[dict] = []

        def one(item):
            number, case = item
            outcome = run_case(number, case, work, reference, shared)
            flags = outcome["crashes"] + outcome["wrong"] + outcome["mismatch"] + outcome["persistent"]
            flagged = "  <-- " + "; ".join(flags) if flags else ""
            print(f"{number:>3} {case.name}: verify {outcome['verify_rc']}, unpack {outcome['unpack_rc']}, "
                  f"start {_start_said(outcome)} ({outcome['seconds']} s){flagged}", flush=True)
            if not args.keep:
                shutil.rmtree(work / "cases" / f"{number:03d}", ignore_errors=True)
            return outcome

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(one, enumerate(chosen, 1)))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    import torch

    counts = summary([o for o in outcomes if o["category"] != "forged"])
    forged = summary([o for o in outcomes if o["category"] == "forged"])
    elapsed = time.perf_counter() - began
    header = [f"vgc bundle campaign (issue 51): seed {args.seed}, {len(outcomes)} cases ({counts['damaged or hostile']}"
              f" damaged or hostile, {counts['cases'] - counts['damaged or hostile']} intact control, "
              f"{forged['cases']} forged), "
              f"{time.strftime('%Y-%m-%d')}, CPU ({os.cpu_count()} cores), torch {torch.__version__}, "
              f"Python {sys.version.split()[0]}, {args.jobs} at a time, {elapsed / 60:.1f} min",
              source,
              "command: python tools/bundle_campaign.py" + (f" --seed {args.seed}" if args.seed != 5106 else "")
              + (f" --only {args.only!r}" if args.only else ""),
              "totals (every case but the forged ones): " + ", ".join(f"{k} {n}" for k, n in counts.items()),
              "forged (every record recomputed over the damage, as only someone rewriting the bundle's records "
              "would: outside what content hashes can catch, counted apart): "
              + ", ".join(f"{k} {n}" for k, n in forged.items()),
              "by category: " + ", ".join(f"{c} {sum(o['category'] == c for o in outcomes)}"
                                          for c in dict.fromkeys(o["category"] for o in outcomes)),
              ""]
    text = table(outcomes, header)
    print(text)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes, indent=1))
    bad = counts["crashes"] + counts["wrong answers"] + counts["mismatches"] + counts["persistent"] + counts["escapes"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
