"""The README's benchmark scripts run (tiny sizes, one subprocess each): a script that no test
runs rots, and the command behind a README figure must keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("script", "args", "expect"), [
    ("bench_ring_compute.py", ["--seq-local", "64", "--worlds", "2", "--repeats", "1"],
     "ring compute per rank / ideal"),
    ("bench_window_plan.py", ["--world", "2", "--seq-local", "64", "--repeats", "1",
                              "--big", "8192"],
     "whole-sequence attention of one rank"),
    ("bench_engine_memory.py", ["--quick"], "forward attention FLOPs counted"),
    ("bench_methods.py", ["--tokens", "256", "--repeats", "1"], "max err vs fp64"),
    ("bench_precision.py", ["--worlds", "2", "--seeds", "1"],
         "worst GQA (8 query heads, 1 kv heads): max error"),
])
def test_benchmark_script_runs(script, args, expect):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert expect in res.stdout, res.stdout[-3000:]
