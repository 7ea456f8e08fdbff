"""Every Python block of README.md and docs/ runs as written, or says on its first line why it cannot here.

A block's first line may be:
- `# needs <what>: <why>` (a GPU, several GPUs, a Hub checkpoint): not run on the CPU;
- `# runs in tests/<file>`: that test runs it (the file must name the page);
- `# given: a, b (what they are)`: it runs after a preamble here that makes those names (the model the text says
  to bring);
- anything else: it runs as written, in a fresh process with an empty vgc cache (the extended step).
docs/dynamic-shapes.md's blocks run with their recorded outputs in `test_doc_examples.py`.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CHECKED_ELSEWHERE = {"dynamic-shapes.md": "tests/test_doc_examples.py"}
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)

# What a `# given:` block is handed: a tiny transformers causal LM and a left-padded batch for it.
PREAMBLE = {
    frozenset({"model", "input_ids", "mask"}): textwrap.dedent("""\
        import torch, transformers
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048)).eval()
        model.generation_config.pad_token_id = 0
        input_ids = torch.tensor([[5, 17, 42, 8], [0, 0, 7, 9]])
        mask = (input_ids != 0).long()
        """),
}


def blocks():
    """(page, number on the page, code) of every Python block."""
    for page in PAGES:
        for number, match in enumerate(_BLOCK.finditer(page.read_text()), 1):
            yield page, number, match.group(1)


def given(detail: str) -> frozenset:
    """The names a `# given:` line lists, before its parenthesised description."""
    return frozenset(name.strip() for name in detail.split("(", 1)[0].split(","))


def kind(page: Path, code: str) -> tuple[str, str]:
    first = code.splitlines()[0] if code.strip() else ""
    if page.name in CHECKED_ELSEWHERE:
        return "elsewhere", CHECKED_ELSEWHERE[page.name]
    for prefix, name in (("# needs ", "needs"), ("# runs in ", "elsewhere"), ("# given: ", "given")):
        if first.startswith(prefix):
            return name, first[len(prefix):].strip()
    return "run", ""


def runnable():
    return [pytest.param(page, code, id=f"{page.name}-{number}") for page, number, code in blocks()
            if kind(page, code)[0] in ("run", "given")]


def test_every_block_runs_here_or_says_why_not():
    seen = 0
    for page, number, code in blocks():
        what, detail = kind(page, code)
        where = f"{page.name} block {number}"
        if what == "needs":
            assert re.fullmatch(r"[^:]+: \S.*", detail), f"{where}: '# needs <what>: <why>', got {detail!r}"
        elif what == "elsewhere":
            test = REPO / detail.split()[0].split("::")[0]
            assert test.is_file() and page.name in test.read_text(), f"{where}: {detail} does not run it"
        elif what == "given":
            names = given(detail)
            assert names in PREAMBLE, f"{where}: nothing here makes {sorted(names)}"
        seen += 1
    assert seen >= 10


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("page, code", runnable())
def test_block_runs_as_written(page, code, tmp_path):
    what, detail = kind(page, code)
    preamble = PREAMBLE[given(detail)] if what == "given" else ""
    script = tmp_path / "block.py"
    script.write_text(preamble + code)
    env = dict(os.environ, VGC_CACHE_ROOT=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_every_environment_variable_vgc_reads_is_in_the_readme_table():
    readme = (REPO / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    source = "\n".join(path.read_text() for path in (REPO / "vgc").rglob("*.py"))
    read = set(re.findall(r"[\"'](VGC_[A-Z_]+)[\"']", source))
    read |= {"VGC_" + name for name in re.findall(r"_(?:lookup|flag)\(\"([A-Z_]+)\"", source)}
    assert len(read) >= 8, read
    missing = sorted(name for name in read if f"`{name}" not in readme)
    assert not missing, f"README's environment table lacks {missing}"


def _numbers_commands() -> list[str]:
    """The commands in the last column of docs/benchmarks.md's tables (each row's `command` cell): the backticked
    strings there that start with a command word."""
    commands = []
    for line in (REPO / "docs" / "benchmarks.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[-1]) <= set("-: ") or cells[-1] == "command":
            continue
        commands += [c for c in re.findall(r"`([^`]+)`", cells[-1]) if c.split()[0] in _COMMAND_WORDS]
    return commands


_COMMAND_WORDS = ("vgc", "bash", "python", "pytest")   # what starts a command in a `command` cell


def test_every_command_on_the_current_numbers_page_exists():
    """Each `vgc ...` command the page shows parses with the CLI as it is now (a renamed row, flag or benchmark
    fails here), and each script or tool it runs is in the tree."""
    import importlib
    import shlex

    from vgc.shells import cli

    commands = _numbers_commands()
    assert len(commands) >= 5, commands
    for command in commands:
        words = shlex.split(command)
        if words[0] == "vgc" and words[1] == "bench":
            parser = importlib.import_module(f"vgc.shells.bench.{words[2]}").build_parser()
            parser.exit_on_error = False
            try:
                parser.parse_args(words[3:])
            except (SystemExit, Exception) as error:   # noqa: BLE001 - argparse exits on a bad choice
                pytest.fail(f"docs/benchmarks.md shows `{command}`, which `vgc bench {words[2]}` refuses: {error!r}")
        elif words[0] == "vgc":
            cli.build_parser().parse_args(words[1:])
        elif words[0] in ("bash", "python"):
            assert (REPO / words[1]).is_file(), f"docs/benchmarks.md runs {words[1]}, which is not in the tree"
        else:
            assert words[0] == "pytest", command
