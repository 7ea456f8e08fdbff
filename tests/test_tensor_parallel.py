"""Tensor parallelism: the tiny decoder sharded over 2 processes (gloo on the CPU, NCCL on 2 GPUs), its all-reduces
inside compiled pieces, a cache directory per rank, warm restarts that never call Inductor, and a failed rank
that stops every rank instead of leaving them in a collective."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vgc
from conftest import free_port
from vgc.models import llama

TP_WORKER = Path(__file__).parent / "workers" / "tp_worker.py"
TP_TOL = dict(atol=1e-4, rtol=1e-4)   # fp32; partial sums added in another order than one matmul's


def run_ranks(tmp_path: Path, name: str, root: Path, world_size: int = 2, fail: dict | None = None,
              options: dict | None = None, device: str = "cpu", env: dict | None = None,
              live: bool = False, collectives: bool = False, dropin: bool = False,
              simulated_graphs: bool = False) -> list[dict]:
    """Start `world_size` worker processes as one job and wait for all; returns each rank's report."""
    out = tmp_path / name
    out.mkdir()
    port = free_port()
    environment = {**os.environ, "VGC_CACHE_ROOT": str(root), **(env or {})}
    procs = []
    for rank in range(world_size):
        command = [sys.executable, str(TP_WORKER), str(rank), str(world_size), str(port), str(out),
                   "--options", json.dumps(options or {}), "--device", device]
        if fail and rank in fail:
            command += ["--fail", fail[rank]]
        if live:
            command.append("--live")
        if collectives:
            command.append("--collectives")
        if dropin:
            command.append("--dropin")
        if simulated_graphs:
            command.append("--simulated-graphs")
        procs.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = [p.communicate(timeout=600)[0] for p in procs]
    reports = []
    for rank, proc in enumerate(procs):
        path = out / f"rank{rank}.json"
        if not path.exists():
            assert fail and fail.get(rank) == "exit", f"rank {rank} wrote no report (rc {proc.returncode}):\n" \
                                                      f"{logs[rank][-3000:]}"
            reports.append(None)
            continue
        report = json.loads(path.read_text())
        if report.get("error") is None:
            report["outputs"] = torch.load(out / f"rank{rank}.pt")
        reports.append(report)
    return reports


@pytest.fixture(scope="module")
def unsharded_outputs():
    """The tiny decoder with no tensor parallelism, eager, on the batches the workers run."""
    import tp_worker

    torch.manual_seed(0)
    cfg = llama.tiny_config()
    model = llama.Llama(cfg).eval()
    with torch.no_grad():
        return {f"{kind}-{n}": model(**llama.make_batch(cfg, n, kind)) for kind, n in tp_worker.BATCHES}


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    """A cold start of both ranks on an empty root, then a warm restart of both from it."""
    tmp = tmp_path_factory.mktemp("tp")
    root = tmp / "root"
    return root, run_ranks(tmp, "cold", root), run_ranks(tmp, "warm", root)


def test_sharded_decoder_equals_the_unsharded_one(tp_runs, unsharded_outputs):
    _, cold, warm = tp_runs
    for report in cold + warm:
        assert report["error"] is None, report["error"]
        for name, expected in unsharded_outputs.items():
            # every rank ends with the whole hidden state: replicated embeddings and norms, all-reduced projections
            torch.testing.assert_close(report["outputs"]["compiled"][name], expected, **TP_TOL,
                                       msg=f"rank {report['rank']} {name}")
            torch.testing.assert_close(report["outputs"]["eager"][name], expected, **TP_TOL)


def test_all_reduces_stay_inside_compiled_pieces(tp_runs):
    _, cold, _ = tp_runs
    cfg = llama.tiny_config()
    for report in cold:
        # the same split as one GPU: two pieces per layer around its attention, plus the last; the all-reduces
        # after o_proj and down_proj split nothing
        assert report["pieces"] == 2 * cfg.num_layers + 1, report


def test_each_rank_has_its_own_cache_directory_and_a_warm_restart_compiles_nothing(tp_runs):
    root, cold, warm = tp_runs
    dirs = [report["cache_dirs"] for report in cold]
    assert [Path(d[0]).name for d in dirs] == ["rank_0_0", "rank_1_0"], dirs
    assert Path(dirs[0][0]).parent == Path(dirs[1][0]).parent   # one entry: the ranks share the key
    factors = json.loads((Path(dirs[0][0]) / "cache_key_factors.json").read_text())["factors"]
    assert factors["environment"]["world_size"] == 2, factors["environment"]
    for report in cold:
        assert report["counters"]["inductor_compiles"] > 0, report["counters"]
    for report in warm:
        assert report["counters"]["inductor_compiles"] == 0, report["counters"]
        assert report["counters"]["dynamo_traces"] == 0 and report["trace_source"] == "saved", report
        assert report["warnings"] == [], report["warnings"]
    assert [r["cache_dirs"] for r in warm] == dirs


def test_a_rank_whose_start_fails_stops_every_rank_with_its_error(tp_runs, tmp_path):
    root, _, _ = tp_runs
    healthy, failed = run_ranks(tmp_path, "fail", root, fail={1: "trace"})
    assert failed["error"] is not None and "kv_caches has 1 entries" in failed["error"], failed
    assert healthy["error_type"] == "RankFailedError", healthy
    assert "rank 1 failed to start this model" in healthy["error"] and "kv_caches has 1 entries" in \
        healthy["error"], healthy["error"]


@pytest.mark.extended
def test_a_live_traced_rank_checks_in_too(tmp_path, unsharded_outputs):
    # a model with hooks cannot save its trace: Dynamo compiles and runs it in one call, and vgc checks in
    # from inside that call, between building the pieces and running them
    reports = run_ranks(tmp_path, "live-fail", tmp_path / "live-root", fail={1: "trace"}, live=True)
    assert reports[0]["error_type"] == "RankFailedError" and "kv_caches has 1 entries" in reports[0]["error"], \
        reports[0]
    for report in run_ranks(tmp_path, "live", tmp_path / "live-root", live=True):
        assert report["error"] is None and report["trace_source"] == "traced-live", report
        torch.testing.assert_close(report["outputs"]["compiled"]["decode-8"], unsharded_outputs["decode-8"],
                                   **TP_TOL)


def test_cuda_graph_modes_pad_and_replay_the_sharded_decoder(tmp_path, unsharded_outputs):
    # conftest's stand-in for graph capture: both ranks pad each batch to the same capture size and replay FULL
    # (decode) and piece (prefill) graphs whose recorded calls include the all-reduces
    reports = run_ranks(tmp_path, "graphs", tmp_path / "unused-root", simulated_graphs=True,
                        options={"cudagraph_mode": "full_and_piecewise", "cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
                        env={"VGC_DISABLE_COMPILE_CACHE": "1"})
    for report in reports:
        assert report["error"] is None, report["error"]
        graphs = report["cudagraphs"]
        assert graphs["full_graphs"] == 5 and graphs["piecewise_graphs"] == 3 * 5, graphs
        assert report["counters"]["cudagraph_replays"] > 0, report["counters"]
        for name, expected in unsharded_outputs.items():   # decode-3 pads to 4; prefill-40 is above every size
            torch.testing.assert_close(report["outputs"]["compiled"][name], expected, **TP_TOL, msg=name)


@pytest.mark.extended
def test_dropin_compiles_the_sharded_decoder_too(tmp_path, unsharded_outputs):
    for report in run_ranks(tmp_path, "dropin", tmp_path / "dropin-root", dropin=True):
        assert report["error"] is None, report["error"]
        assert report["pieces"] >= 2 * llama.tiny_config().num_layers + 1, report   # split at attention only
        for name, expected in unsharded_outputs.items():
            torch.testing.assert_close(report["outputs"]["compiled"][name], expected, **TP_TOL, msg=name)


def test_ranks_start_without_checking_in_when_torch_has_no_store_accessor(monkeypatch):
    import torch.distributed as dist

    from vgc import _compat

    monkeypatch.delattr(dist.distributed_c10d, "_get_default_store", raising=False)
    assert _compat.default_store() is None


@pytest.mark.extended
def test_a_rank_that_dies_before_its_start_is_named_after_the_timeout(tp_runs, tmp_path):
    root, _, _ = tp_runs
    healthy, dead = run_ranks(tmp_path, "dead", root, fail={1: "exit"}, env={"VGC_RANK_TIMEOUT_S": "5"})
    assert dead is None
    assert healthy["error_type"] == "RankFailedError", healthy
    assert "rank(s) [1] did not finish starting" in healthy["error"], healthy["error"]


@pytest.mark.extended
def test_a_rank_built_with_another_ranks_shard_is_refused_and_named_by_the_others(tp_runs, tmp_path):
    root, _, _ = tp_runs
    healthy, wrong = run_ranks(tmp_path, "wrong-rank", root, fail={1: "wrong-rank"}, env={"VGC_RANK_TIMEOUT_S": "5"})
    assert "cfg.tp_rank=0 but this process is rank 1" in wrong["error"], wrong
    assert healthy["error_type"] == "RankFailedError" and "rank(s) [1]" in healthy["error"], healthy


def test_a_tensor_parallel_config_must_divide_the_heads():
    with pytest.raises(ValueError, match="num_kv_heads=2 is not divisible by tp_size=4"):
        llama.tiny_config().sharded(0, 4)
    with pytest.raises(ValueError, match=r"tp_rank must be an int in \[0, tp_size=2\), got 2"):
        llama.tiny_config().sharded(2, 2)


def test_the_collective_op_without_a_process_group_names_the_fix():
    with pytest.raises(RuntimeError, match="init_process_group"):
        vgc.ops.collectives.register_group()


@pytest.mark.extended
def test_the_tensor_parallel_benchmark_runs_every_row_and_restarts_warm(tmp_path):
    # the CPU smoke run of `vgc bench decode --tp`: every row at TP=1 and TP=2 in one run, equal outputs, and a warm
    # restart of both ranks that neither traces nor compiles
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "vgc", "bench", "decode", "--tp", "1,2", "--model", "tiny",
                           "--device", "cpu", "--batches", "1,3", "--steps", "2", "--warmup", "1", "--warm-restart",
                           "--json", str(out)], env={**os.environ, "VGC_CACHE_ROOT": str(tmp_path / "root")},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    for tp in ("1", "2"):
        rows = report["results"][tp]["rows"]
        assert list(rows) == ["eager", "inductor default", "vgc NONE"], rows
        assert all("error" not in r and set(r["ms"]) == {"decode 1", "decode 3"} for r in rows.values()), rows
        for rank in report["warm_restart"][tp]:
            assert rank["vgc NONE"]["inductor_compiles"] == 0 and rank["vgc NONE"]["dynamo_traces"] == 0, rank
    assert all(r["max_diff"] < 1e-4 for r in report["results"]["2"]["rows"].values()), report["results"]["2"]
    assert "speed-up of TP=2 over TP=1" in done.stdout


# ---- NCCL: collectives captured in CUDA graphs ----
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_rank_nccl_all_reduces_captured_in_cuda_graphs_equal_eager(tmp_path):
    # one GPU: the all-reduces run over a one-rank NCCL group, so every graph mode captures real NCCL launches
    root = tmp_path / "root"
    for mode in ("piecewise", "full_and_piecewise"):
        for name in ("cold", "warm"):
            (report,) = run_ranks(tmp_path, f"{mode}-{name}", root, world_size=1, device="cuda", collectives=True,
                                  options={"cudagraph_mode": mode, "cudagraph_capture_sizes": [1, 2, 4, 8, 16]})
            assert report["error"] is None, report["error"]
            assert report["cudagraphs"]["piecewise_graphs"] > 0 and report["counters"]["cudagraph_replays"] > 0
            if mode == "full_and_piecewise":
                assert report["cudagraphs"]["full_graphs"] > 0, report["cudagraphs"]
            for batch, out in report["outputs"]["compiled"].items():
                torch.testing.assert_close(out, report["outputs"]["eager"][batch], atol=1e-3, rtol=1e-3)
            if name == "warm":
                assert report["counters"]["inductor_compiles"] == 0, report["counters"]



two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA devices")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("mode", ["piecewise", "full_and_piecewise"])
def test_nccl_all_reduces_captured_in_cuda_graphs_equal_eager(tmp_path, mode):
    root = tmp_path / "root"
    for name in ("cold", "warm"):
        reports = run_ranks(tmp_path, f"{mode}-{name}", root, device="cuda",
                            options={"cudagraph_mode": mode, "cudagraph_capture_sizes": [1, 2, 4, 8, 16]})
        for report in reports:
            assert report["error"] is None, report["error"]
            assert report["cudagraphs"]["piecewise_graphs"] > 0 and report["counters"]["cudagraph_replays"] > 0
            if mode == "full_and_piecewise":   # the whole decode step, attention and all-reduces, in one graph
                assert report["cudagraphs"]["full_graphs"] > 0, report["cudagraphs"]
            for batch, out in report["outputs"]["compiled"].items():
                torch.testing.assert_close(out, report["outputs"]["eager"][batch], atol=1e-3, rtol=1e-3)
        if name == "warm":
            assert all(r["counters"]["inductor_compiles"] == 0 for r in reports), [r["counters"] for r in reports]
