"""Run the transformers family matrix (tests/family_matrix.py) over every causal LM class and print its table.

    python tools/family_matrix.py                      # every class, three paths, eager pieces (~15 min on 2 cores)
    python tools/family_matrix.py --inductor llama     # some model types, pieces compiled by Inductor
    python tools/family_matrix.py --json out.json      # also keep the outcomes
    python tools/family_matrix.py --docs docs/transformers.md   # and put the table between its markers

Exit status 1 when any path of any class gave other tokens than eager or failed without a clear refusal.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import family_matrix  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="model types to run (default: all)")
    parser.add_argument("--inductor", action="store_true", help="compile pieces with Inductor (default: eager "
                        "pieces, the same capture, split and paths without the compiler)")
    parser.add_argument("--json", help="write {class: outcomes} to this file")
    parser.add_argument("--docs", help="replace the table between <!-- family-matrix --> markers in this file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("vgc").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    results, bad = {}, 0
    for name, model_type, class_name, overrides in family_matrix.cases():
        if args.model_types and model_type not in args.model_types:
            continue
        start = time.perf_counter()
        outcome = family_matrix.run(model_type, class_name, piece_backend="inductor" if args.inductor else "eager",
                                    **overrides)
        results[name] = {"model_type": model_type, **outcome, "seconds": round(time.perf_counter() - start, 1)}
        bad += family_matrix.failed(outcome)
        print(json.dumps({name: results[name]}), flush=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    text = table(results)
    print(text)
    if args.docs:
        write_docs(pathlib.Path(args.docs), text, "Inductor" if args.inductor else "eager")
    return 1 if bad else 0


def write_docs(path: pathlib.Path, text: str, pieces: str) -> None:
    import datetime

    import torch
    import transformers
    start, end = "<!-- family-matrix -->", "<!-- /family-matrix -->"
    page = path.read_text()
    if start not in page or end not in page:
        raise SystemExit(f"{path} has no {start} ... {end} markers to put the table between")
    stamp = (f"Run on {datetime.date.today()} with torch {torch.__version__}, transformers {transformers.__version__}, "
             f"{pieces} pieces, on the CPU (`python tools/family_matrix.py --docs {path}`).")
    head, rest = page.split(start, 1)
    path.write_text(f"{head}{start}\n{stamp}\n\n{text}\n{end}{rest.split(end, 1)[1]}")


def table(results: dict) -> str:
    def cell(text: str) -> str:
        if text == "equal":
            return "equal"
        if text.startswith("refused"):
            reason = text[len("refused: "):]
            if " cannot be served by " in reason:   # the probe's form: "<class> cannot be served by <path>: <why>."
                reason = reason.split(" cannot be served by ", 1)[1].split(": ", 1)[-1].split(". Serve")[0]
            else:   # an earlier check's: "<class> <why>; serve it with ..."
                reason = reason.split("; serve", 1)[0].split(". Serve", 1)[0]
            return "refused: " + reason.replace("|", "/")
        return f"**{text.splitlines()[0]}**"
    served = [n for n, r in results.items() if "skipped" not in r]
    lines = ["| class | model type | integration | breakable | drop-in |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {results[n]['model_type']} | " + " | ".join(cell(results[n][p]) for p in family_matrix.PATHS)
              + " |" for n in served]
    skipped = [f"- {n}: {r['skipped']}" for n, r in results.items() if "skipped" in r]
    accepted = sum(results[n]["compile"] == "equal" for n in served)
    bad = [n for n in served if family_matrix.failed(results[n])]
    verdict = "none with other tokens or a crash on any path" if not bad else \
        f"**other tokens or a crash in {len(bad)}: {', '.join(bad)}**"
    lines += ["", f"{len(served)} rows run (classes, and variants of one), {accepted} accepted by the integration with "
              f"eager's tokens, {verdict}. {len(skipped)} classes skipped, each with the reason:", "", *skipped]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
