# Issue 29, warm start: the commit before this session's changes (benchmarks/device/base-vgc.tar, its vgc/) against
# the working tree, interleaved, llama_1b, no capture, with bytecode caching as an installed torch has it.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
python -c "import torch; from torch._inductor.codecache import torch_key; print(torch.__version__, type(torch_key).__name__, hasattr(torch_key, 'set'))" > "$OUT/torch_key_api.txt" 2>&1
mkdir -p /tmp/base && tar -xf benchmarks/device/base-vgc.tar -C /tmp/base
for tree in /tmp/base "$PWD"; do (cd "$tree" && PYTHONPATH=. python -c "import vgc, torch._inductor.compile_fx, torch._inductor.select_algorithm") ; done
timeout 300 python benchmarks/device/warm_ab.py /tmp/base "$PWD" 3 llama_1b cuda "$OUT/warm_ab.json" > "$OUT/warm_ab.log" 2>&1
echo "warm_ab rc=$?" >> "$OUT/summary.txt"
PYTHONPATH=. timeout 200 python -m vgc bench startup --warm-runs 2 --json "$OUT/startup.json" > "$OUT/startup.log" 2>&1
echo "startup rc=$?" >> "$OUT/summary.txt"
