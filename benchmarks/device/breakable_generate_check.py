"""Breakable graphs under generate() on the H200: do the graphs change the tokens, or does the attention op?
(Call g's gpu test failure was its own: reference and prepared model shared one config object, so the reference
ran vgc's attention without the padding mask. This checks the fixed setup on the GPU.)

Three copies of the gpu test's tiny fp32 Llama (and of one with larger initial weights, whose logits are further
apart): transformers' SDPA; vgc's "vgc_breakable" attention run eagerly (a captured batch size the call does not
have); the same with breakable graphs. Per pair: tokens equal, where rows first differ, the largest logit
difference before that, and the reference's top-2 logit gap where they differ. Then llama_1b bf16 batch 1: where a
replayed decode step's time goes (host per step, kernels per step, the top kernels).

usage: PYTHONPATH=. python benchmarks/device/breakable_generate_check.py OUT_DIR"""
import json
import sys
import time

import torch
import transformers

from vgc.integrations import transformers as vgc_transformers

out = sys.argv[1]
report = {}


def compare(a, b):
    tokens_a, tokens_b = a.sequences, b.sequences
    logits_a, logits_b = torch.stack(a.logits, 1), torch.stack(b.logits, 1)   # [batch, steps, vocab]
    rows = []
    for row in range(tokens_a.shape[0]):
        prompt = tokens_a.shape[1] - logits_a.shape[1]
        differ = (tokens_a[row, prompt:] != tokens_b[row, prompt:]).nonzero()
        first = int(differ[0]) if len(differ) else None
        upto = first + 1 if first is not None else logits_a.shape[1]
        diff = (logits_a[row, :upto] - logits_b[row, :upto]).abs().max().item()
        gap = None
        if first is not None:
            top = logits_a[row, first].topk(2).values
            gap = (top[0] - top[1]).item()
        rows.append({"first_differing_step": first, "max_logit_diff_until_then": diff, "top2_gap_there": gap})
    return {"tokens_equal": bool(torch.equal(tokens_a, tokens_b)), "rows": rows}


for init in (0.02, 0.2):
    models = []
    for _ in range(3):   # each its own config: the attention implementation is set on the config
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                                          initializer_range=init)
        torch.manual_seed(0)
        models.append(transformers.LlamaForCausalLM(config).cuda().eval())
    reference, op_eager, graphs = models
    vgc_transformers.breakable(op_eager, batch_sizes=[7])   # batch 2 is not captured: the op runs eagerly
    vgc_transformers.breakable(graphs, batch_sizes=[1, 2])
    torch.manual_seed(0)
    ids = torch.randint(1, 128, (2, 9), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                  output_logits=True, return_dict_in_generate=True)
    r, e, g = (m.generate(**kwargs) for m in (reference, op_eager, graphs))
    report[f"init {init}"] = {"sdpa vs op eager": compare(r, e), "op eager vs graphs": compare(e, g),
                              "sdpa vs graphs": compare(r, g), "graphs stats": graphs.vgc_breakable.stats()}
    print(init, {k: v["tokens_equal"] for k, v in report[f"init {init}"].items() if isinstance(v, dict) and
                 "tokens_equal" in v})

# llama_1b bf16, batch 1: one replayed decode step under the profiler
from vgc.shells.bench.generate import _build, _shape   # noqa: E402

model = _build(_shape("llama_1b", None), "cuda", torch.bfloat16)
vgc_transformers.breakable(model, batch_sizes=[1])
ids = torch.randint(1, 1000, (1, 64), device="cuda")
model.generate(input_ids=ids, max_new_tokens=16)
router = model.forward
steps = []


def timed(**kw):
    began = time.perf_counter()
    result = router(**kw)
    steps.append(time.perf_counter() - began)
    return result


timed.__wrapped__ = router
model.forward = timed
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
    model.generate(input_ids=ids, max_new_tokens=33)
    torch.cuda.synchronize()
model.forward = router
events = prof.key_averages()
kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
report["llama_1b decode"] = {"host_ms_per_call_median": sorted(steps)[len(steps) // 2] * 1e3,
                             "calls": len(steps), "gpu_events": kernels,
                             "stats": model.vgc_breakable.stats()}
with open(f"{out}/profile_llama_1b.txt", "w") as f:
    f.write(events.table(sort_by="self_cuda_time_total", row_limit=30))
    f.write("\n\n")
    f.write(events.table(sort_by="self_cpu_time_total", row_limit=30))
json.dump(report, open(f"{out}/check.json", "w"), indent=1, default=str)
print(json.dumps(report["llama_1b decode"], default=str)[:600])
