"""Where the host time of one `vgc bench generate` row goes (H200 investigation, not a test): builds the row, runs
its first generate(), then a cProfile of one more (sorted by own time, then by cumulative time).

    PYTHONPATH=. python benchmarks/profile_rows.py --row "vgc CompileConfig (static cache)" --batch 1
"""

import argparse
import cProfile
import io
import pstats
import time

import torch

import vgc
from vgc.shells.bench.generate import ROWS, _build, _rows, _shape


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", action="append", choices=ROWS, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    vgc._compat.allow_recompiles(64)
    base = _build(_shape("llama_1b", None), "cuda", torch.bfloat16)
    prompt = torch.randint(1, 1000, (args.batch, 64), device="cuda")
    gen = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
               min_new_tokens=args.new_tokens, do_sample=False)
    for name, make in _rows(base, args.row, args.batch).items():
        model, kwargs = make()
        with torch.no_grad():
            for i in range(3):
                start = time.perf_counter()
                with vgc.counters.delta() as d:
                    model.generate(prompt, **gen, **kwargs)
                torch.cuda.synchronize()
                print(f"{name}: generate {i} {time.perf_counter() - start:.2f} s {dict(d)}")
            profile = cProfile.Profile()
            profile.enable()
            model.generate(prompt, **gen, **kwargs)
            torch.cuda.synchronize()
            profile.disable()
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(key).print_stats(28)
            print(out.getvalue()[:7000])
        del model


if __name__ == "__main__":
    main()
