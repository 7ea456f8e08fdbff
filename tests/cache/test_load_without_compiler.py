"""Loading an Inductor artifact with the compiler's modules stood in for (`vgc/_compat/inductor_load.py`): the
loaded code answers as the compiled one did, the compiler is not imported, the stand-ins leave no trace, other
threads and other names get the real modules, and a load that fails that way loads the ordinary way.

Each check runs in a fresh process: the test process has imported the compiler long ago."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

COMPILE = textwrap.dedent('''
    import sys, torch
    from vgc import _compat

    class Layer(torch.nn.Module):
        def forward(self, x, w, b):
            return torch.relu(torch.addmm(b, x, w)) + x @ w

    gm = torch.fx.symbolic_trace(Layer())
    inputs = [torch.randn(5, 8), torch.randn(8, 8), torch.randn(8)]
    artifact = _compat.standalone_compile(gm, inputs, dynamic_shapes="from_example_inputs", config_patches={})
    _compat.save_artifact(artifact, sys.argv[1], "binary")
    print(sorted(_compat.torch_extern_kernels()))
''')

PRELUDE = textwrap.dedent('''
    import json, sys, threading, torch
    from vgc import _compat
    from vgc._compat import inductor_load

    def imported():
        return _compat.compiler_modules_imported()

    def stand_ins():
        return [n for n, m in sys.modules.items() if isinstance(m, inductor_load._StandIn)]

    def check(artifact):
        torch.manual_seed(1)
        x, w, b = torch.randn(5, 8), torch.randn(8, 8), torch.randn(8)
        out = artifact(x, w, b)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return (out - (torch.relu(torch.addmm(b, x, w)) + x @ w)).abs().max().item()

    report = {}
''')


def run(code, *args, env=None):
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """(path, recorded extern kernel names, environment) of one artifact compiled in a child process."""
    work = tmp_path_factory.mktemp("light_load")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    path = work / "layer.bin"
    names = run(COMPILE, str(path), env=env)
    return str(path), json.loads(names.replace("'", '"')), env


def test_the_compiling_process_records_the_torch_functions_under_extern_kernels(artifact):
    _, names, _ = artifact
    assert {"mm", "addmm", "bmm"} <= set(names)
    assert "bias_addmm" not in names   # Inductor's own function, not torch's


def test_an_artifact_loads_and_answers_without_importing_the_compiler(artifact):
    path, names, env = artifact
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        loaded = _compat.load_artifact(sys.argv[1], "binary", json.loads(sys.argv[2]))
        report["diff"] = check(loaded)
        report["imported"], report["stand_ins"] = imported(), stand_ins()
        import torch._inductor.select_algorithm as real   # a later compile gets the real modules
        report["real"] = hasattr(real, "AlgorithmSelectorCache") and real.extern_kernels.mm is torch.mm
        report["diff_after"] = check(loaded)
        report["debug_flags"] = isinstance(torch._inductor.debug, inductor_load._DebugFlags)
        print(json.dumps(report))
    '''), path, json.dumps(names), env=env))
    assert report["diff"] < 1e-5 and report["diff_after"] < 1e-5   # fp32, against torch's own ops
    assert report["imported"] == [] and report["stand_ins"] == []
    assert report["real"] and not report["debug_flags"]   # the real `debug` took the flags' place


def test_the_ordinary_load_imports_the_compiler(artifact):
    """What the check above would see without the stand-ins: the test can fail."""
    path, _, env = artifact
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        loaded = _compat.load_artifact(sys.argv[1], "binary", None)
        report["diff"] = check(loaded)
        report["imported"] = imported()
        print(json.dumps(report))
    '''), path, env=env))
    assert report["diff"] < 1e-5
    assert {"torch._inductor.select_algorithm", "torch._inductor.compile_fx"} <= set(report["imported"])


def test_a_load_that_fails_with_stand_ins_loads_the_ordinary_way(artifact):
    path, names, env = artifact
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        def broken(self, name, answers):
            raise RuntimeError("a torch that loads differently")
        inductor_load._Window.place = broken
        loaded = _compat.load_artifact(sys.argv[1], "binary", json.loads(sys.argv[2]))
        report["diff"], report["stand_ins"] = check(loaded), stand_ins()
        print(json.dumps(report))
    '''), path, json.dumps(names), env=env))
    assert report["diff"] < 1e-5 and report["stand_ins"] == []


HEADERS = textwrap.dedent('''
    import os
    from torch._inductor import codecache
    codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = sys.argv[3], os.path.join(sys.argv[3], "locks")
    real, made = codecache._precompile_header, []

    def counted(*args, **kwargs):   # Inductor's own step: a preprocessor run over torch's headers
        made.append(args[0])
        return real(*args, **kwargs)
    codecache._precompile_header = counted
    from vgc.cache.cpp_headers import headers_remembered
    with headers_remembered():   # as the store loads an artifact
        loaded = _compat.load_artifact(sys.argv[1], "binary", json.loads(sys.argv[2]))
    report["diff"], report["made"] = check(loaded), made
    print(json.dumps(report))
''')


def test_a_load_takes_the_precompiled_header_an_earlier_load_made(artifact, tmp_path):
    """Inductor makes its C++ header again in every process before it looks a kernel up; a load takes it from the
    record of an earlier process. A damaged record, or one whose compiled header is gone, makes it again and is
    rewritten; the loaded kernels answer as torch's ops every time."""
    path, names, env = artifact
    headers = tmp_path / "headers"

    def load():
        report = json.loads(run(PRELUDE + HEADERS, path, json.dumps(names), str(headers), env=env))
        assert report["diff"] < 1e-5
        return report["made"]
    assert load()   # the first load makes it (the test can fail)
    records = list((headers / "vgc-known").iterdir())
    assert records and load() == []
    for record in records:
        record.write_bytes(b"\xff\x00 not a path")
    assert load()
    assert all(os.path.isfile(record.read_text()) for record in records) and load() == []
    for compiled in headers.glob("*.gch"):
        compiled.unlink()
    assert load() and load() == []


def test_stand_ins_answer_only_their_thread_and_names():
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        kernels = inductor_load.TorchKernels(["mm", "not a name", 3, "_private", "__class__"])
        report["mm"] = kernels.mm is torch.mm
        with inductor_load.deferred_compiler(["mm"]):
            loader = {"__name__": "torch._inductor.codecache"}   # the cache hit's own import, as torch makes it
            exec("from torch._inductor.graph import GraphLowering", loader)
            report["mine"] = loader["GraphLowering"] is inductor_load._NoOutputCodeHook
            report["stand_ins_before"] = stand_ins()
            seen = {}
            def other():
                from torch._inductor.graph import GraphLowering
                seen["class"] = GraphLowering
            thread = threading.Thread(target=other); thread.start(); thread.join()
            report["other_real"] = seen["class"] is not inductor_load._NoOutputCodeHook and \\
                hasattr(seen["class"], "run")
            # the real module imported, every stand-in left: this thread now gets the real one too
            report["stand_ins_after_real"] = stand_ins()
            from torch._inductor.graph import GraphLowering as after
            report["after_real"] = after is seen["class"]
        report["unrecorded"] = kernels.bias_addmm.__module__   # from the real namespace, on first use
        print(json.dumps(report))
    ''')))
    assert report["mm"] and report["mine"] and report["other_real"] and report["after_real"]
    assert "torch._inductor.graph" in report["stand_ins_before"]
    assert report["stand_ins_after_real"] == []
    assert report["unrecorded"].startswith("torch._inductor")


def test_a_stand_in_answers_no_caller_but_torchs_loading_code():
    """Code that is not torch's load (a real compiler module being imported, a user's) never gets a stand-in's
    answer, even in the loading thread."""
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        with inductor_load.deferred_compiler(["mm"]):
            from torch._inductor.graph import GraphLowering
            report["real"] = GraphLowering is not inductor_load._NoOutputCodeHook and hasattr(GraphLowering, "run")
            report["stand_ins"] = stand_ins()
        import torch._inductor.debug
        report["debug_real"] = torch._inductor.debug is sys.modules["torch._inductor.debug"]
        print(json.dumps(report))
    ''')))
    assert report["real"] and report["stand_ins"] == [] and report["debug_real"]


def test_an_unknown_name_on_a_stand_in_imports_the_real_module():
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        with inductor_load.deferred_compiler([]):
            from torch._inductor.compile_fx import compile_fx   # not a stand-in's name
            report["real"] = callable(compile_fx) and "compile_fx" in sys.modules["torch._inductor.compile_fx"].__dict__
            report["stand_ins"] = stand_ins()
        print(json.dumps(report))
    ''')))
    assert report["real"] and report["stand_ins"] == []


def test_the_cache_keys_inductor_config_without_importing_the_compiler():
    """Torch 2.15 serializes `inductor_choices_class` through `torch._inductor.choices`, which imports the
    scheduler and `select_algorithm`; vgc's key skips that while no choices can exist, and equals torch's own."""
    report = json.loads(run(PRELUDE + textwrap.dedent('''
        import torch._inductor.config as config
        mine = _compat.inductor_config_portable()
        report["imported"] = imported()
        report["equal"] = mine == config.save_config_portable()
        print(json.dumps(report))
    ''')))
    assert report["imported"] == [] and report["equal"]


def test_an_index_record_without_usable_names_loads_the_ordinary_way(monkeypatch):
    """What the store hands the load: the recorded names, or None (torch's ordinary load) for a record saved
    before them, a damaged value, or `VGC_LOAD_WITHOUT_COMPILER=0`."""
    from vgc.cache.store import _extern_kernels

    assert _extern_kernels({"extern_kernels": ["mm", 3, "addmm"]}) == ["mm", "addmm"]
    assert _extern_kernels({}) is None and _extern_kernels({"extern_kernels": "mm"}) is None
    monkeypatch.setenv("VGC_LOAD_WITHOUT_COMPILER", "0")
    assert _extern_kernels({"extern_kernels": ["mm"]}) is None
