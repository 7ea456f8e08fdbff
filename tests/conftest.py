"""Shared test setup. Inductor's cache lives in one directory per test session: a fresh one costs ~8.5 s of
CPU-ISA probing, paid once per session instead of once per test (subprocesses inherit it)."""

import os
import socket
import sys
import tempfile

_SESSION_DIR = tempfile.mkdtemp(prefix="vgc-tests-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_SESSION_DIR, "inductor"))
os.environ.setdefault("VGC_CACHE_ROOT", os.path.join(_SESSION_DIR, "vgc-cache"))
for _var in ("VLLM_DISABLE_COMPILE_CACHE", "VGC_DISABLE_COMPILE_CACHE", "VLLM_COMPILE_CACHE_SAVE_FORMAT",
             "VGC_COMPILE_CACHE_SAVE_FORMAT"):
    os.environ.pop(_var, None)
# The worker scripts run as processes; a test also imports one for what it shares with its workers (the batches).
sys.path.append(os.path.join(os.path.dirname(__file__), "workers"))

import pytest  # noqa: E402
import torch  # noqa: E402

import vgc  # noqa: E402
from vgc.models import llama  # noqa: E402
from simulated_graphs import install_simulated_capture  # noqa: E402  (tests/ is on sys.path)

# fp32 on CPU: Inductor reorders reductions and fuses ops, so results differ from eager by rounding only.
FP32_TOL = dict(atol=2e-5, rtol=2e-5)


def items_close(got: list, want: list, **tol) -> None:
    """Per-item outputs (an encoder's images and videos) as many as expected, each equal within `tol`."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, **tol, msg=f"item {i}")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most 4. Each worker pays its own fresh Inductor cache dir and its own
    session-scoped compiles, so more workers than that add start-up, not speed."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture(autouse=True)
def _fresh_warn_once(monkeypatch):
    """vgc warns once per problem per process: each test starts with none warned, so a test that expects a warning
    sees it whichever tests ran before it in this process (an xdist worker runs any subset, in any order)."""
    monkeypatch.setattr(vgc.log, "_warned", set())


@pytest.fixture
def fresh_counters():
    vgc.counters.reset()
    torch._dynamo.reset()
    yield vgc.counters


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("VGC_DISABLE_COMPILE_CACHE", "1")


@pytest.fixture(scope="session")
def tiny():
    """(cfg, model): the tiny reference decoder, built once. Tests only call it: its KV caches live in
    `make_batch`'s dict, not in the model, so no test changes what the next one sees."""
    cfg = llama.tiny_config()
    return cfg, llama.Llama(cfg)


@pytest.fixture
def dynamo_counters():
    """Dynamo's own counters, cleared: `dynamo_counters["stats"]["unique_graphs"]` counts the graphs it made."""
    # torch._dynamo.utils.counters is private torch API with no public equivalent: the tests read it here only.
    counters = torch._dynamo.utils.counters
    counters.clear()
    return counters


def assert_matches_eager(cfg, model, compiled, sizes, kinds=("prefill", "decode")):
    """The compiled tiny decoder gives eager's outputs for every kind of batch and number of tokens."""
    with torch.no_grad():
        for kind in kinds:
            for n in sizes:
                eager = model(**llama.make_batch(cfg, n, kind))
                out = compiled(**llama.make_batch(cfg, n, kind))
                torch.testing.assert_close(out, eager, **FP32_TOL, msg=f"{kind} T={n}")


def hf_llama(num_hidden_layers, causal_lm: bool = False):
    """An unmodified Hugging Face Llama (its base model, or with the LM head) with SDPA attention and seeded random
    weights."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")
    torch.manual_seed(0)
    return (transformers.LlamaForCausalLM if causal_lm else transformers.LlamaModel)(config).eval()


class MLP(torch.nn.Module):
    """A model with no attention: one compiled piece."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))) + x


class SiblingBlock(torch.nn.Module):
    """A user's model whose attention projections (with biases) and MLP read one input each."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
        self.gate, self.up = (torch.nn.Linear(16, 32, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        n = x.shape[0]
        q, k, v = (proj(x).view(1, n, 2, 8).transpose(1, 2) for proj in (self.q, self.k, self.v))
        h = x + torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, 16)
        return h + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


@pytest.fixture
def simulated_capture(monkeypatch):
    install_simulated_capture(monkeypatch.setattr)


@pytest.fixture
def simulated_cuda(monkeypatch, simulated_capture, no_cache, fresh_counters):
    """`simulated_capture`, with the compiled model's inputs reported as CUDA tensors (so vgc.compile sets up its
    graph runtime), no on-disk cache and fresh counters."""
    monkeypatch.setattr(vgc._compat, "device_from_inputs", lambda example_inputs: torch.device("cuda"))
    return fresh_counters


def triton_device():
    """Where vgc's Triton kernels can run here: CUDA, or Triton's CPU interpreter (TRITON_INTERPRET=1); else None."""
    from vgc.ops import triton_launch

    if triton_launch.triton is None:
        return None
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else None


def mount_tmpfs(path, options: str) -> bool:
    """A fresh tmpfs at `path` (created) with mount `options` ("size=1m", "size=64m,nr_inodes=24", "size=1m,ro"),
    for roots that fill up or refuse writes; False where this machine cannot mount one (not root)."""
    import subprocess

    os.makedirs(path, exist_ok=True)
    try:
        # mode 0700: a tmpfs root is world-writable by default, which vgc refuses to load from
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(path)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def free_port() -> int:
    """A free TCP port on this host, for a process group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
