"""GPU tests (marker `gpu`; skipped without CUDA). Run on the H200 with: pytest -m gpu."""

import dataclasses

import pytest
import torch

import vgc
from vgc.models import llama

pytestmark = pytest.mark.gpu

# bf16 keeps 8 bits of mantissa: Inductor's fused kernels round intermediates differently from eager's
# op-by-op execution, so hidden states of size O(1) differ by a few bf16 ulps after the final norm.
BF16_TOL = dict(atol=6e-2, rtol=5e-2)


@pytest.fixture(scope="module")
def tiny_bf16():
    cfg = dataclasses.replace(llama.tiny_config(), dtype=torch.bfloat16)
    return cfg, llama.Llama(cfg).cuda()


@pytest.mark.parametrize("path", ["dropin", "vgc.compile"])
def test_bf16_tiny_decoder_equals_eager_on_cuda(path, tiny_bf16, no_cache):
    cfg, model = tiny_bf16
    if path == "dropin":
        compiled = torch.compile(model, backend="vgc")
    else:
        compiled = vgc.compile(model)
        compiled.warmup(lambda n: llama.make_batch(cfg, n, "prefill", device="cuda"))
    with torch.no_grad():
        for kind in ("prefill", "decode"):
            for n in (1, 3, 17, 64):
                eager = model(**llama.make_batch(cfg, n, kind, device="cuda"))
                out = compiled(**llama.make_batch(cfg, n, kind, device="cuda"))
                assert out.dtype == torch.bfloat16
                torch.testing.assert_close(out, eager, **BF16_TOL, msg=f"{kind} T={n}")
                assert (out.float() - eager.float()).abs().mean() < 5e-3
