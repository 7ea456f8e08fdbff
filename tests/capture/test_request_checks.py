"""Token ids outside an embedding table raise IndexError before the compiled code runs (it would abort the process
on the CPU: Inductor's bounds check fails inside an OpenMP region), and the model keeps working afterwards."""

import copy

import pytest
import torch
import torch.nn as nn

import vgc
from vgc import envs
from vgc.capture import request_checks
from vgc.models import llama
from conftest import FP32_TOL, hf_llama

# Small inputs only: their kernels run outside OpenMP, so a missing check fails these tests with Inductor's
# RuntimeError instead of aborting the test process.


class Lookup(nn.Module):
    """A user's model vgc has never seen: an embedding and a projection."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(100, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, ids):
        return self.proj(self.embed(ids))


def _checker(model, *args):
    """(checker, example_inputs) for the graph Dynamo hands a backend, found inside the backend as vgc's is (Dynamo
    drops the placeholders' sources afterwards); no Inductor compile."""
    found = []

    def backend(gm, example_inputs):
        found.append((request_checks.checker_for(gm, example_inputs), example_inputs))
        return gm.forward

    torch.compile(model, backend=backend, fullgraph=True)(*args)
    return found[0]


def _assert_refused(call, ids, expected):
    with pytest.raises(IndexError, match=r"holds ids in \[") as raised:
        call(ids)
    assert expected in str(raised.value)


def test_user_module_refuses_bad_ids_then_matches_eager():
    model, backend = Lookup().eval(), vgc.VgcBackend()
    compiled = torch.compile(model, backend=backend)
    good = torch.tensor([[1, 2, 99]])
    with torch.no_grad():
        torch.testing.assert_close(compiled(good), model(good), **FP32_TOL)
        _assert_refused(compiled, torch.tensor([[1, 100, 70000]]),
                        "ids holds ids in [1, 70000] but the embedding embed has 100 rows (valid: 0..99)")
        _assert_refused(compiled, torch.tensor([[-1, 2, 3]]), "ids holds ids in [-1, 3]")
        torch.testing.assert_close(compiled(good), model(good), **FP32_TOL)
    [checked] = backend.graphs[0].input_check.checked
    assert (checked.name, checked.table, checked.rows) == ("ids", "embed", 100)


def test_vgc_compile_llama_refuses_bad_input_ids_then_matches_eager(tiny):
    cfg, model = tiny
    compiled = vgc.compile(model)
    with torch.no_grad():
        compiled(**llama.make_batch(cfg, 8, "prefill"))
        for bad in (cfg.vocab_size, -1):
            batch = llama.make_batch(cfg, 8, "prefill")
            batch["input_ids"][3] = bad
            with pytest.raises(IndexError, match=rf"input_ids holds ids in \[.*{bad}.*\] but the embedding "
                                                 rf"embed_tokens has {cfg.vocab_size} rows"):
                compiled(**batch)
        torch.testing.assert_close(compiled(**llama.make_batch(cfg, 8, "prefill")),
                                   model(**llama.make_batch(cfg, 8, "prefill")), **FP32_TOL)
    # positions index a table too, but through arithmetic, not an embedding lookup: only input_ids is checked
    assert [c.name for c in compiled.backend.graphs[0].input_check.checked] == ["input_ids"]


def test_check_is_not_installed_with_the_env_var_off(monkeypatch):
    monkeypatch.setenv("VGC_CHECK_INPUT_IDS", "0")
    model, backend = Lookup().eval(), vgc.VgcBackend()
    good = torch.tensor([[4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(good), model(good), **FP32_TOL)
    assert backend.graphs[0].input_check is None


@pytest.mark.parametrize("value, expected", [(None, True), ("", True), ("1", True), ("0", False), ("off", False)])
def test_env_var(monkeypatch, value, expected):
    monkeypatch.delenv("VLLM_CHECK_INPUT_IDS", raising=False)
    if value is None:
        monkeypatch.delenv("VGC_CHECK_INPUT_IDS", raising=False)
    else:
        monkeypatch.setenv("VGC_CHECK_INPUT_IDS", value)
    assert envs.check_input_ids() is expected


def test_env_var_bad_value_is_an_error(monkeypatch):
    monkeypatch.setenv("VGC_CHECK_INPUT_IDS", "maybe")
    with pytest.raises(ValueError, match="VGC_CHECK_INPUT_IDS='maybe' is not a boolean"):
        envs.check_input_ids()


class Shapes(nn.Module):
    """Ids through a view (checked), through a slice (not: eager never reads the dropped ids) and into two
    tables (checked against the smaller)."""

    def __init__(self):
        super().__init__()
        self.big, self.small = nn.Embedding(50, 4), nn.Embedding(30, 4)

    def forward(self, ids, tail_ids, shared):
        return self.big(ids.view(-1)).sum() + self.big(tail_ids[:, 1:]).sum() + \
            self.big(shared).sum() + self.small(shared).sum()


def test_finder_follows_views_not_slices_and_takes_the_smaller_table():
    check, _ = _checker(Shapes(), torch.tensor([[1, 2]]), torch.tensor([[3, 4]]), torch.tensor([5]))
    assert sorted((c.name, c.table, c.rows) for c in check.checked) == [("ids", "big", 50), ("shared", "small", 30)]


class MasksInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, ids):
        ids.masked_fill_(ids >= 10, 0)   # image-placeholder ids beyond the vocabulary, replaced before the lookup
        return self.embed(ids)


def test_ids_rewritten_in_place_before_the_lookup_are_not_checked():
    check, _ = _checker(MasksInPlace(), torch.tensor([1, 12]))
    assert check is None


def test_finder_finds_an_unmodified_hugging_face_embedding():
    pytest.importorskip("transformers")
    model = hf_llama(num_hidden_layers=1)
    check, example_inputs = _checker(model, torch.tensor([[1, 2, 3]]))
    [checked] = check.checked
    assert (checked.table, checked.rows) == ("embed_tokens", 128)
    with pytest.raises(IndexError, match="but the embedding embed_tokens has 128 rows"):
        check([torch.tensor([[1, 128]]) if i == checked.position else x for i, x in enumerate(example_inputs)])


def test_aten_embedding_and_empty_ids():
    check = request_checks.InputIdCheck([request_checks.CheckedInput(0, "", "ids", "t", 5)])
    check([torch.empty(0, dtype=torch.long)])   # nothing to look up, nothing to refuse
    gm = torch.fx.symbolic_trace(lambda weight, ids: torch.ops.aten.embedding.default(weight, ids))
    [checked] = request_checks.checker_for(gm, [torch.zeros(7, 2), torch.tensor([0])]).checked
    assert (checked.position, checked.rows) == (1, 7)


def test_the_check_on_bound_arguments_finds_ids_where_dynamo_read_them():
    """FULL graph replays skip the compiled forward: the check runs on the call's arguments, top-level or nested."""
    check = request_checks.InputIdCheck([
        request_checks.CheckedInput(0, "L['input_ids']", "input_ids", "embed", 10),
        request_checks.CheckedInput(1, "L['batch']['extra'][0]", "batch['extra'][0]", "other", 5),
        request_checks.CheckedInput(2, "", "x", "unreadable", 5),   # not read from an argument: left out
    ]).by_argument_name()
    good = {"input_ids": torch.tensor([0, 9]), "batch": {"extra": [torch.tensor([4])]}}
    check(good)
    with pytest.raises(IndexError, match="input_ids holds ids in \\[0, 10\\]"):
        check({**good, "input_ids": torch.tensor([0, 10])})
    with pytest.raises(IndexError, match="the embedding other has 5 rows"):
        check({**good, "batch": {"extra": [torch.tensor([5])]}})
    assert request_checks.InputIdCheck([request_checks.CheckedInput(0, "", "x", "t", 5)]).by_argument_name() is None


@pytest.mark.parametrize("shape", [(1,), (3, 5), (64,), (65,), (8, 100)])
def test_every_reduction_of_the_ids_finds_the_bad_one(shape):
    """Ids are reduced as a Python list up to 64 of them, by aminmax beyond: each way names the lowest and highest
    id, wherever the bad one sits, in 1-D and 2-D ids."""
    check = request_checks.InputIdCheck([request_checks.CheckedInput(0, "", "ids", "embed", 50)])
    ids = torch.arange(torch.Size(shape).numel()).reshape(shape) % 50
    check([ids])
    for bad, position in ((50, -1), (-3, 0), (12345, ids.numel() // 2)):
        broken = ids.clone()
        broken.view(-1)[position] = bad
        low, high = int(broken.min()), int(broken.max())
        with pytest.raises(IndexError, match=rf"ids holds ids in \[{low}, {high}\] but the embedding embed has 50"):
            check([broken])


class UserClamps(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, ids):
        return self.embed(ids.clamp(0, 9))   # the model's own rule for ids beyond its vocabulary


def test_the_graph_clamps_checked_ids_and_the_check_still_refuses(monkeypatch):
    """A FULL graph replays before its check ends, so the compiled graph itself must never read outside the table:
    with the check taken out, a bad id gives the clamped id's answer instead of Inductor's bounds error; with it,
    the call is refused as before. A user's own clamp is the model's rule: nothing to check, nothing added."""
    model, backend = Lookup().eval(), vgc.VgcBackend()
    compiled = torch.compile(model, backend=backend)
    bad = torch.tensor([[1, 100, -5]])
    with torch.no_grad():
        _assert_refused(compiled, bad, "ids holds ids in [-5, 100]")
        monkeypatch.setattr(request_checks, "_check_ids", lambda item, ids: None)
        torch.testing.assert_close(compiled(bad), model(bad.clamp(0, 99)), **FP32_TOL)
    clamps = [n for n in backend.graphs[0].pieces[0].module.graph.nodes if n.target is torch.clamp]
    assert [n.args[1:] for n in clamps] == [(0, 99)]

    gm = torch.fx.symbolic_trace(lambda weight, ids: torch.ops.aten.embedding.default(weight, ids))
    example = [torch.zeros(7, 2), torch.tensor([0])]
    for _ in range(2):   # a second pass finds the ids behind vgc's clamp and adds none
        [checked] = request_checks.checker_for(gm, example, bound=True).checked
        assert (checked.position, checked.rows) == (1, 7)
        assert [n.args[1:] for n in gm.graph.nodes if n.target is torch.clamp] == [(0, 6)]
    assert torch.equal(gm(torch.arange(14.).view(7, 2), torch.tensor([9, -1])), torch.tensor([[12., 13.], [0., 1.]]))

    check, _ = _checker(UserClamps(), torch.tensor([3, 12]))
    assert check is None


def test_a_begun_check_of_host_ids_refuses_at_once():
    """`begin` (a FULL replay's check) checks ids off CUDA where it is called: a bad one is refused before the
    replay, and good ones leave nothing to wait for."""
    check = request_checks.InputIdCheck([
        request_checks.CheckedInput(0, "L['input_ids']", "input_ids", "embed", 10)]).by_argument_name()
    assert check.begin({"input_ids": torch.tensor([0, 9])})() is None
    with pytest.raises(IndexError, match=r"input_ids holds ids in \[0, 10\]"):
        check.begin({"input_ids": torch.tensor([0, 10])})


@pytest.mark.gpu
def test_a_begun_check_of_cuda_ids_refuses_when_it_ends():
    """On CUDA a decode step's ids travel to the host behind the GPU work queued before them; the end waits for
    them and refuses a bad one, in 1-D and 2-D; more ids than a decode step's are checked at once; a check begun
    while a graph is being captured checks nothing."""
    check = request_checks.InputIdCheck([
        request_checks.CheckedInput(0, "L['input_ids']", "input_ids", "embed", 50)]).by_argument_name()
    for shape in ((1,), (8,), (2, 32)):
        ids = (torch.arange(torch.Size(shape).numel(), device="cuda") % 50).reshape(shape)
        bad = ids.clone()
        bad.view(-1)[-1] = 50
        low = int(bad.min())   # 50 when the bad id is the only one
        for value, refused in ((ids, False), (bad, True), (ids, False)):
            torch.cuda._sleep(20_000_000)   # the copy queues behind GPU work: the end must wait for it
            end = check.begin({"input_ids": value})
            if refused:
                with pytest.raises(IndexError, match=rf"input_ids holds ids in \[{low}, 50\]"):
                    end()
            else:
                assert end() is None
    with pytest.raises(IndexError, match=r"input_ids holds ids in \[50, 50\]"):
        check.begin({"input_ids": torch.full((65,), 50, device="cuda")})
    two = request_checks.InputIdCheck([   # two inputs of one shape, both copies in flight at once
        request_checks.CheckedInput(0, "L['a']", "a", "embed", 50),
        request_checks.CheckedInput(1, "L['b']", "b", "other", 10)]).by_argument_name()
    torch.cuda._sleep(20_000_000)
    end = two.begin({"a": torch.tensor([3, 49], device="cuda"), "b": torch.tensor([3, 10], device="cuda")})
    with pytest.raises(IndexError, match=r"b holds ids in \[3, 10\] but the embedding other has 10 rows"):
        end()
    graph = torch.cuda.CUDAGraph()
    bad = torch.tensor([50], device="cuda")
    with torch.cuda.graph(graph):
        end = check.begin({"input_ids": bad})
    assert end() is None


@pytest.mark.gpu
def test_a_full_replay_refuses_a_bad_id_after_the_graph_ran_and_the_gpu_stays_usable(tiny):
    """The FULL graph replays before the check of its ids ends: the bad call is refused, its output never returned,
    the CUDA context still works (the graph clamped the id), and the next steps equal eager's."""
    cfg, model = tiny
    model = copy.deepcopy(model).cuda()   # the fixture stays on the CPU for the tests after
    kv = llama.make_kv_caches(cfg, "cuda")
    compiled = vgc.compile(model, config=vgc.CompilationConfig(cudagraph_mode="full", cudagraph_capture_sizes=[4, 8]),
                           pad_values=llama.PAD_VALUES)
    compiled.warmup(lambda n: llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
    with torch.no_grad():
        batch = llama.make_batch(cfg, 6, "decode", device="cuda", kv_caches=kv)
        batch["input_ids"][2] = cfg.vocab_size
        with vgc.counters.expect(cudagraph_replays=1), \
                pytest.raises(IndexError, match=rf"input_ids holds ids in \[.*{cfg.vocab_size}\]"):
            compiled(**batch)
        torch.cuda.synchronize()
        for n in (6, 3):
            out = compiled(**llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
            expected = model(**llama.make_batch(cfg, n, "decode", device="cuda", kv_caches=kv))
            torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)   # Inductor's CUDA kernels vs eager's
