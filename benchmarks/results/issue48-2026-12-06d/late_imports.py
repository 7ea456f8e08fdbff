"""The modules a process imported after `vgc.models` (so during the model's build and warmup()), top-level rows of
`python -X importtime`, largest first. Usage: python late_imports.py importtime.txt [N]"""
import sys

lines = open(sys.argv[1]).read().splitlines()
start = max(i for i, line in enumerate(lines) if line.rstrip().endswith(" vgc.models.llama"))
rows = []
for line in lines[start + 1:]:
    parts = line.split("|")
    if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  "):
        rows.append((int(parts[1]) / 1e6, parts[2].strip()))
rows.sort(reverse=True)
print(f"imported after vgc.models: {sum(r[0] for r in rows):.3f} s in {len(rows)} top-level imports")
for seconds, name in rows[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]:
    print(f"{seconds:8.3f}  {name}")
