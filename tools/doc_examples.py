"""Regenerate, or check, the printed output of the examples in a Markdown page.

An example is a ```python block (a complete script) followed, blank lines allowed, by a ```text block
holding what the script prints. Each script runs in a fresh interpreter (this one's `sys.executable`) in
its own temporary directory, with `import vgc` taken from this checkout, an empty vgc cache of its own
(`VGC_CACHE_ROOT`, so a "first run" is cold, as the pages say) and one Inductor kernel cache shared by the
whole run (it holds only kernels, and a fresh one costs seconds of CPU probing per example).

What is recorded is stdout and stderr interleaved as they were written (the `logging` example's lines on
stderr belong to the output), without Python's warnings (`file.py:12: UserWarning: ...` and the source
line under it): the pages say torch's warnings are left out. Blank lines at the end are dropped. The
temporary directory is written as `/tmp/vgc-example`, so the page reads the same whatever directory a run
got.

    python tools/doc_examples.py docs/dynamic-shapes.md            # rewrite the text blocks
    python tools/doc_examples.py --check docs/dynamic-shapes.md    # exit 1 with a diff if a block is stale

`--check` compares after masking what differs from run to run: durations (floats with many digits), the
hex cache hashes in paths, the directories of the source paths torch prints (`... # mp/vgc-example/
example.py:16 in forward`; torch shortens them relative to its own install directory) and the numbers
of torch's size symbols (`s0`, `u1`). Anything else that differs is printed as a unified diff per example.

An example that exits with an error or runs past `--timeout` (300 s) stops the run, and the page is left as
it was. The whole of docs/dynamic-shapes.md takes 80-95 s on a 2-core CPU (4 s of it per example just to
import torch); `tests/test_doc_examples.py::test_doc_outputs_are_current` runs the check (marked slow).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLACEHOLDER_DIR = "/tmp/vgc-example"
DEFAULT_TIMEOUT_S = 300

# A fence line inside either block would end it, so neither body may contain a line starting with ```.
_EXAMPLE = re.compile(
    r"^```python\n(?P<code>(?:(?!```).*\n)*)```\n(?:[ \t]*\n)*"
    r"^```text\n(?P<output>(?:(?!```).*\n)*)```$",
    re.MULTILINE,
)
_PYTHON_FENCE = re.compile(r"^```python$", re.MULTILINE)

# warnings.formatwarning: "path:line: Category: message", then the source line indented by two spaces.
_WARNING = re.compile(r"^\S.*?:\d+: \w*Warning: ")
_WARNING_SOURCE = re.compile(r"^  \S")

_VARYING = [
    (re.compile(r"\b\d+\.\d{5,}\b"), "<float>"),
    (re.compile(r"(?<=/)[0-9a-f]{10,}(?=/)"), "<hash>"),
    (re.compile(r"[^\s(]*/([^\s/(]+\.py:\d+ in )"), r"\1"),
    (re.compile(r"\b([su])\d+\b"), r"\1<n>"),
]


@dataclass
class Example:
    number: int          # 1-based, in page order
    line: int            # of the ```python fence
    code: str
    output: str
    output_span: tuple[int, int]

    @property
    def name(self) -> str:
        return f"example {self.number} (line {self.line})"


class ExampleFailed(Exception):
    pass


def find_examples(page: str) -> list[Example]:
    return [
        Example(number, page.count("\n", 0, m.start()) + 1, m["code"], m["output"], m.span("output"))
        for number, m in enumerate(_EXAMPLE.finditer(page), start=1)
    ]


def count_python_blocks(page: str) -> int:
    return len(_PYTHON_FENCE.findall(page))


def drop_warnings(output: str) -> str:
    kept, after_warning = [], False
    for line in output.splitlines(keepends=True):
        if _WARNING.match(line):
            after_warning = True
            continue
        if not (after_warning and _WARNING_SOURCE.match(line)):
            kept.append(line)
        after_warning = False
    return "".join(kept)


def normalise(output: str) -> str:
    for pattern, replacement in _VARYING:
        output = pattern.sub(replacement, output)
    return output


def run_example(example: Example, inductor_cache: str, timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="vgc-example-") as workdir:
        script = Path(workdir, "example.py")
        script.write_text(example.code)
        env = dict(
            os.environ,
            VGC_CACHE_ROOT=str(Path(workdir, "cache")),
            TORCHINDUCTOR_CACHE_DIR=inductor_cache,
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            # Unbuffered, so that stdout and stderr, sharing one pipe, keep the order they were written in.
            PYTHONUNBUFFERED="1",
        )
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ExampleFailed(f"{example.name} did not finish within {timeout:g} s (see --timeout)") from None
        output = drop_warnings(proc.stdout)
        # The directory name alone also covers the paths torch prints shortened, with their start cut off.
        output = output.replace(workdir, PLACEHOLDER_DIR).replace(Path(workdir).name, Path(PLACEHOLDER_DIR).name)
    if proc.returncode != 0:
        raise ExampleFailed(f"{example.name} exited with status {proc.returncode}; its output:\n{output}")
    # A message ending in a newline, printed, leaves a blank last line that would only look like a typo.
    return output.rstrip("\n") + "\n" if output.strip() else ""


def run_all(examples: list[Example], timeout: float, inductor_cache: str | None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="vgc-doc-inductor-") as fresh_cache:
        outputs = []
        for example in examples:
            start = time.perf_counter()
            outputs.append(run_example(example, inductor_cache or fresh_cache, timeout))
            print(f"{example.name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return outputs


def check(examples: list[Example], outputs: list[str], page_name: str) -> bool:
    ok = True
    for example, output in zip(examples, outputs):
        expected, actual = normalise(example.output), normalise(output)
        if expected != actual:
            ok = False
            sys.stdout.writelines(difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                fromfile=f"{page_name}: {example.name}, as written", tofile=f"{example.name}, as run now"))
    return ok


def rewrite(path: Path, ran: list[Example], outputs: list[str]) -> None:
    # The page is read again: it may have been edited while the examples ran (they take minutes).
    page = path.read_text()
    examples = find_examples(page)
    if [e.code for e in examples] != [e.code for e in ran]:
        raise ExampleFailed(f"the examples in {path} changed while they ran; run again")
    # From the last block up, so that the spans of the blocks above stay valid.
    for example, output in reversed(list(zip(examples, outputs))):
        start, end = example.output_span
        page = page[:start] + output + page[end:]
    path.write_text(page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="Markdown file, e.g. docs/dynamic-shapes.md")
    parser.add_argument("--check", action="store_true", help="compare with the page instead of rewriting it")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per example")
    parser.add_argument("--inductor-cache", metavar="DIR",
                        help="Inductor cache to share instead of a fresh temporary one (the test passes its "
                             "session's, already probed)")
    args = parser.parse_args(argv)

    examples = find_examples(args.page.read_text())
    if not examples:
        print(f"{args.page}: no ```python block followed by a ```text block", file=sys.stderr)
        return 1
    try:
        outputs = run_all(examples, args.timeout, args.inductor_cache)
        if args.check:
            if not check(examples, outputs, str(args.page)):
                print(f"{args.page} is stale: run python tools/doc_examples.py {args.page}", file=sys.stderr)
                return 1
            return 0
        rewrite(args.page, examples, outputs)
    except ExampleFailed as e:
        print(f"{args.page}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
