"""`vgc bench startup --generate`: a row's verdicts follow what served its calls."""

import json
import math
import os
import subprocess
import sys
import time

from vgc.shells.bench import first_minute


def test_a_tiered_row_that_never_swapped_has_no_full_speed(tmp_path, capsys):
    """A one-second window ends long before a tiered start's background compile (seconds on the CPU): every
    generate() ran on the first tier, so the row reaches no full speed. (The first generate() used to count as
    compiled: the tier is None until that call starts the tiered warm-up.)"""
    env = {**os.environ, "VGC_CACHE_ROOT": str(tmp_path / "vgc"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    out = subprocess.run([sys.executable, "-m", "vgc.shells.bench.first_minute", "--child", "vgc integration tiered",
                          "tiny", "cpu", "1.0", repr(time.time())], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["tier_calls"]["compiled"] == 0 and row["generates"] >= 1
    assert math.isnan(row["full_speed_s"]) and row["first_output_s"] > 0
    assert row["background_compile"] == "running"   # said by the row, beside its missing full speed
    first_minute.report([row], 1.0)
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("vgc integration tiered")]
    assert line.split()[6:] == ["none", format(row["tokens_per_s"], ".1f"), str(row["generates"]), "background",
                                "compile", "running"]
