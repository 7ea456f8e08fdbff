"""The `vgc` command line, on cache entries written by hand: no test here compiles anything."""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

import vgc
from vgc.shells import demo
from vgc.shells.bench import decode, encoder, generate, hf, startup
from vgc.shells import cache_cli
from vgc.cache import inventory, layout
from vgc.cache.keys import cache_key, source_factors
from vgc.shells.cli import build_parser, main

FAKE_ENV = {"device_type": "cpu", "python": "3.11", "torch_version": "2.13.0+cpu"}


def make_entry(root: Path, config: vgc.CompilationConfig, env: dict = FAKE_ENV, source_paths=(),
               sources=(("model.py", "cc7a4f6b950a1595"),), age_s: float = 0.0) -> inventory.Entry:
    """An entry laid out as `store.py` writes one: key factors, an index and one binary artifact."""
    srcs = source_factors(source_paths) if source_paths else [list(s) for s in sources]
    key, factors = cache_key(config.hash_factors(), env, srcs)
    rank_dir = root / layout.CACHE_SUBDIR / key / "rank_0_0"
    (rank_dir / "artifacts").mkdir(parents=True)
    (rank_dir / "cache_key_factors.json").write_text(
        json.dumps({"hash": key, "factors": factors, "source_paths": [str(p) for p in source_paths]}))
    blob = b"artifact bytes"
    (rank_dir / "artifacts" / "piece-0-dynamic.bin").write_bytes(blob)
    record = {"file": "piece-0-dynamic.bin", "format": "binary", "piece": "submod_0", "size": None,
              "created": time.time(), "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (rank_dir / "index.json").write_text(json.dumps({"piece-0-dynamic": record}))
    stamp = time.time() - age_s
    for path in [rank_dir, *rank_dir.rglob("*")]:
        os.utime(path, (stamp, stamp))
    return inventory.Entry(rank_dir.parent)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture
def two_entries(tmp_path):
    """Two entries of one model file that differ only in `compile_sizes`; the second is three days old."""
    root = tmp_path / "root"
    new = make_entry(root, vgc.CompilationConfig(compile_sizes=[1, 16]))
    old = make_entry(root, vgc.CompilationConfig(compile_sizes=[1, 8]), age_s=3 * 86400)
    return root, new, old


@pytest.mark.parametrize("argv", [["-v", "demo"], ["demo", "-v"], ["demo", "--verbose", "--device", "cpu"]])
def test_verbose_before_or_after_the_subcommand(argv):
    assert build_parser().parse_args(argv).verbose is True
    assert build_parser().parse_args(["demo"]).verbose is False


@pytest.mark.parametrize("argv", [["cache", "--root", "{root}", "ls"], ["cache", "ls", "--root", "{root}"],
                                  ["-v", "cache", "ls", "--root", "{root}"], ["cache", "ls", "-v", "--root", "{root}"],
                                  ["cache", "--root", "/nonexistent", "ls", "--root", "{root}"]])
def test_root_before_or_after_the_cache_command(two_entries, capsys, argv):
    root, new, old = two_entries
    code, out = run_cli(capsys, *(a.format(root=root) for a in argv))
    assert code == 0 and new.hash in out and old.hash in out


def test_benchmark_arguments_go_to_the_benchmark(monkeypatch):
    from vgc.shells.bench import startup

    seen = []
    monkeypatch.setattr(startup, "main", lambda argv: seen.append(argv) or 0)
    assert main(["bench", "startup", "-v", "--warm-runs", "1", "--model", "tiny"]) == 0
    assert seen == [["--warm-runs", "1", "--model", "tiny"]]
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--warm-runs", "1"])   # only a benchmark takes arguments vgc does not know
    assert exit_info.value.code == 2


def test_cache_without_a_command_names_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["cache"])
    assert exit_info.value.code == 2
    assert "required: {ls,show,verify,prune,why-miss,pack,unpack}" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"vgc {vgc.__version__}" in out and f"torch {torch.__version__}" in out


def _imported_modules(*argv: str) -> tuple[set[str], str]:
    """The modules `python -m vgc ARGV` imports, and its stdout."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "vgc", *argv], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return names, proc.stdout


@pytest.mark.parametrize("argv", [[], ["cache"], ["cache", "ls"], ["bench"], ["profile"], ["profile", "show"]])
def test_help_imports_no_torch(argv):
    names, out = _imported_modules(*argv, "--help")
    assert out.startswith(f"usage: vgc {' '.join(argv)}".rstrip()), out
    imported = sorted(n for n in names if n == "torch" or n.startswith("torch."))
    assert not imported, f"`{' '.join(['vgc', *argv, '--help'])}` imported torch ({len(imported)} torch modules)"
    assert "vgc.shells.cli" in names   # the import log is read: an empty one would pass the line above


def test_version_from_the_entry_point():
    proc = subprocess.run([sys.executable, "-m", "vgc", "--version"], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.startswith(f"vgc {vgc.__version__} (torch ")


def test_ls_shows_what_tells_entries_apart(two_entries, capsys):
    root, new, old = two_entries
    code, out = run_cli(capsys, "cache", "ls", "--root", str(root))
    assert code == 0
    lines = out.splitlines()
    new_line = next(i for i, line in enumerate(lines) if line.startswith(new.hash))
    old_line = next(i for i, line in enumerate(lines) if line.startswith(old.hash))
    assert new_line < old_line, "most recently used first"
    # the config digest is the start of the config's compute_hash(), so a program can find its entry
    assert vgc.CompilationConfig(compile_sizes=[1, 16]).compute_hash()[:8] in lines[new_line]
    assert vgc.CompilationConfig(compile_sizes=[1, 8]).compute_hash()[:8] in lines[old_line]
    assert "model.py" in lines[new_line]
    assert lines[new_line + 1].split() == ["differs:", "compile_sizes=[1,16]"]
    assert lines[old_line + 1].split() == ["differs:", "compile_sizes=[1,8]"]
    # one entry alone has nothing to be told apart from
    single = root.parent / "single"
    make_entry(single, vgc.CompilationConfig())
    code, out = run_cli(capsys, "cache", "ls", "--root", str(single))
    assert code == 0 and len(out.splitlines()) == 2 and "differs" not in out


def test_ls_tells_apart_sources_of_one_name(tmp_path, capsys):
    files = [tmp_path / "src" / name for name in ("llama/modeling.py", "vit/modeling.py", "vit/utils.py")]
    for i, path in enumerate(files):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"x = {i}\n")
    root = tmp_path / "root"
    entry = make_entry(root, vgc.CompilationConfig(), source_paths=files)
    code, out = run_cli(capsys, "cache", "ls", "--root", str(root))
    line = next(line for line in out.splitlines() if line.startswith(entry.hash))
    assert code == 0 and line.endswith("  llama/modeling.py, utils.py, vit/modeling.py"), line
    # an entry written before paths were kept: only names and digests are known
    old_root = tmp_path / "old"
    make_entry(old_root, vgc.CompilationConfig(), sources=[("model.py", "aaaaaaaa11111111"),
                                                            ("model.py", "bbbbbbbb22222222"), ("util.py", "c" * 16)])
    code, out = run_cli(capsys, "cache", "ls", "--root", str(old_root))
    assert code == 0 and out.splitlines()[1].endswith("  model.py@aaaaaaaa, model.py@bbbbbbbb, util.py"), out


@pytest.mark.parametrize("argv", [["ls"], ["show", "abc"], ["prune", "--older-than", "1d"], ["why-miss"],
                                  ["pack", "-o", "{tmp}/out.vgcb"]])
@pytest.mark.parametrize("make, problem", [(None, "does not exist"), ("file", "is not a directory")])
def test_a_missing_root_is_a_usage_error(tmp_path, capsys, argv, make, problem):
    root = tmp_path / "root"
    if make == "file":
        root.write_text("x")
    code, out = run_cli(capsys, "cache", "--root", str(root), *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2, out
    assert out == (f"vgc cache {argv[0]}: cache root {root} {problem}; pass the root the cache was written under "
                   "(--root) or set VGC_CACHE_ROOT\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if make is None else ["root"]), "nothing written"


def test_ls_cuts_a_long_list_of_differences(tmp_path, capsys):
    root = tmp_path / "root"
    env = {**FAKE_ENV, **{f"factor_{i}": f"value-{i}" for i in range(20)}}
    make_entry(root, vgc.CompilationConfig(), env=env)
    make_entry(root, vgc.CompilationConfig(), env={**env, **{f"factor_{i}": f"other-{i}" for i in range(20)}})
    code, out = run_cli(capsys, "cache", "ls", "--root", str(root))
    differs = [line for line in out.splitlines() if "differs:" in line]
    assert code == 0 and len(differs) == 2
    assert all(len(line) <= 120 and "more; see vgc cache show)" in line for line in differs)


BENCHMARKS = {"startup": startup, "decode": decode, "hf": hf, "generate": generate, "encoder": encoder}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_help_describes_every_option(name, capsys):
    parser = BENCHMARKS[name].build_parser()
    assert parser.description
    options = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]   # argparse lists none publicly
    for action in options:
        assert action.help, f"{action.option_strings} has no help"
        if action.default is not None and action.default is not False:   # 0 is a default to name
            assert "default" in action.help, f"{action.option_strings}: its help names no default"
            assert action.default == "" or "%(default)s" in action.help or str(action.default) in action.help, \
                action.option_strings
    only = [a for a in options if "--only" in a.option_strings]
    if name != "startup":   # every other benchmark is a table of rows
        assert all(row in only[0].help for row in BENCHMARKS[name].ROWS)
    # `vgc bench NAME --help` reaches the benchmark's own parser
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: vgc bench {name}") and " ".join(parser.description.split()[:4]) in " ".join(
        out.split())


@pytest.mark.parametrize("module", [decode, hf])
def test_only_takes_the_rows_and_names_them_on_a_typo(module, capsys):
    parser = module.build_parser()
    assert parser.parse_args([]).only == []
    rows = module.ROWS
    assert parser.parse_args(["--only", f"{rows[-1]}, {rows[0]}"]).only == [rows[-1], rows[0]]
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--only", f"{rows[0]},no such row"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown row(s) ['no such row']" in err and all(repr(row) in err for row in rows)


def test_a_row_name_may_hold_a_comma():
    assert hf.build_parser().parse_args(["--only", "drop-in FULL, one piece,drop-in FULL + passes"]).only == [
        "drop-in FULL, one piece", "drop-in FULL + passes"]


@pytest.fixture
def fake_environment(monkeypatch):
    """This machine's environment as FAKE_ENV: the real one probes the CPU's vector ISA (seconds, once)."""
    monkeypatch.setattr(cache_cli, "environment_factors",
                        lambda device, compiles=True: {**FAKE_ENV, "device_type": device})


def test_why_miss_against_an_entrys_stored_config(tmp_path, capsys, fake_environment):
    model = tmp_path / "model.py"
    model.write_text("x = 1\n")
    root = tmp_path / "root"
    entry = make_entry(root, vgc.CompilationConfig(compile_sizes=[1, 8]), source_paths=[model])
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(root), "--entry", entry.hash[:6])
    assert code == 0, out
    assert f"as stored in entry {entry.hash}" in out and "it would be a hit" in out
    # without --entry the config is the default one, which this entry was not built with
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(root))
    assert code == 1 and "config.compile_sizes: [1, 8] -> []" in out
    # explicit --options still win over the stored config
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(root), "--entry", entry.hash[:6],
                        "--options", '{"compile_sizes": [1, 8], "cudagraph_mode": "full"}')
    assert code == 0 and "as stored" not in out
    model.write_text("x = 2\n")
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(root), "--entry", entry.hash[:6])
    assert code == 1 and f"entry {entry.hash} differs in 1 factor(s)" in out and "sources.model.py" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_why_miss_uses_the_entrys_device(tmp_path, capsys, fake_environment):
    entry = make_entry(tmp_path, vgc.CompilationConfig(), env={**FAKE_ENV, "device_type": "cuda"})
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(tmp_path), "--entry", entry.hash)
    assert code == 2 and "--device cuda: this process sees no CUDA device" in out
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(tmp_path), "--entry", entry.hash,
                        "--device", "cpu")
    assert code == 1 and "environment.device_type: 'cuda' -> 'cpu'" in out


@pytest.mark.parametrize("options, problem", [
    ("{bad", "--options is not valid JSON (Expecting property name enclosed in double quotes"),
    ("", "--options is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ("[1, 8]", "--options must be a JSON object"),
    ('{"compile_size": [8]}', "--options: unknown vgc option(s) ['compile_size']"),
])
def test_why_miss_names_a_bad_options_value(two_entries, capsys, options, problem):
    root, _, _ = two_entries
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(root), "--options", options)
    assert code == 2
    assert out.startswith("vgc cache why-miss: ") and problem in out and len(out.splitlines()) == 1


def test_why_miss_on_an_empty_root_is_a_miss(tmp_path, capsys):
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(tmp_path))
    assert code == 1 and "every compile is a miss" in out


def test_prune_dry_run_removes_nothing(two_entries, capsys):
    root, new, old = two_entries
    code, out = run_cli(capsys, "cache", "prune", "--root", str(root), "--older-than", "2d", "--dry-run")
    assert code == 0
    assert f"would remove {old.hash}" in out and new.hash not in out
    assert "1 entries would be removed, 1 left" in out
    assert {e.hash for e in inventory.entries(root)} == {new.hash, old.hash}
    code, out = run_cli(capsys, "cache", "prune", "--root", str(root), "--older-than", "2d")
    assert code == 0 and f"removed {old.hash}" in out and "1 entries removed, 1 left" in out
    assert [e.hash for e in inventory.entries(root)] == [new.hash]


def test_prune_needs_a_limit(two_entries, capsys):
    root, _, _ = two_entries
    code, out = run_cli(capsys, "cache", "prune", "--root", str(root))
    assert code == 2 and "give --older-than and/or --max-size" in out
    assert len(inventory.entries(root)) == 2


def test_a_prefix_that_names_no_single_entry(two_entries, tmp_path, capsys):
    root, new, old = two_entries
    code, out = run_cli(capsys, "cache", "show", "--root", str(root), "nosuchhash")
    assert code == 2
    assert "no entry" in out and "'nosuchhash'" in out and new.hash in out and old.hash in out
    assert "Traceback" not in out
    code, out = run_cli(capsys, "cache", "why-miss", "--root", str(root), "--entry", "nosuchhash")
    assert code == 2 and "'nosuchhash'" in out
    prefix = os.path.commonprefix([new.hash, old.hash])
    code, out = run_cli(capsys, "cache", "show", "--root", str(root), prefix)
    assert code == 2 and "matches 2 entries" in out and "give more digits" in out
    (tmp_path / "empty").mkdir()
    code, out = run_cli(capsys, "cache", "show", "--root", str(tmp_path / "empty"), "abc")
    assert code == 2 and "there are no entries" in out


def _fail(root, device, kept):
    raise RuntimeError("demo failed")


def test_demo_removes_its_temporary_root_even_on_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "_run", _fail)
    before = os.environ.get("VGC_CACHE_ROOT")
    with pytest.raises(RuntimeError, match="demo failed"):
        demo.main(device="cpu")
    assert list(tmp_path.iterdir()) == []
    assert os.environ.get("VGC_CACHE_ROOT") == before
    assert "removed the temporary cache root" in capsys.readouterr().out


def test_demo_keeps_a_root_it_was_given(tmp_path, monkeypatch, capsys):
    root = tmp_path / "kept"
    root.mkdir()
    monkeypatch.setattr(demo, "_run", lambda root, device, kept: 0)
    assert demo.main(cache_root=str(root), device="cpu") == 0
    assert root.is_dir() and f"cache kept in {root}" in capsys.readouterr().out
