"""Issue 48: why the transformers integration's tiered background compile failed on an H100 (`vgc bench startup
--generate 60`, this session's third call): the same model (`vgc bench generate`'s llama_1b shape, bf16), a tiered
compile, one generate(), a wait for the background compile, another generate(); the child's whole log kept in
$OUT/child.log. Every cache empty (set by the caller)."""
import logging, os, shutil, sys, time
import torch
import vgc.background_compile as bc
from vgc.integrations import transformers as vgc_transformers
from vgc.shells.bench.generate import _build, _shape

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s: %(message)s")
original = bc.BackgroundCompile.cleanup
def keep(self):
    if (self.directory / bc.LOG).exists():
        shutil.copy(self.directory / bc.LOG, os.path.join(os.environ["OUT"], "child.log"))
    original(self)
bc.BackgroundCompile.cleanup = keep

model = _build(_shape("llama_1b", None), "cuda", torch.bfloat16)
vgc_transformers.compile(model, max_batch_size=1, tiered=True)
prompt = torch.randint(model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0)).cuda()
s = time.perf_counter()
with torch.no_grad():
    first = model.generate(prompt, max_new_tokens=32, do_sample=False)
print(f"first generate {time.perf_counter() - s:.2f} s", flush=True)
engine = model.vgc
print("waited:", engine.compiled.wait_for_compile(timeout=120), flush=True)
with torch.no_grad():
    second = model.generate(prompt, max_new_tokens=32, do_sample=False)
stats = engine.stats()
print("tier", engine.compiled.tier, stats.get("tier_calls"), stats.get("background_compile"),
      stats.get("background_seconds"), "\nfailure:", stats.get("background_failure"))
print("same tokens:", torch.equal(first, second))
