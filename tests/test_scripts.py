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


def _train(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--out", str(out),
                           "--seq-len", "64", "--dtype", "float64", "--save-every", "2", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _losses(out: Path) -> list[tuple[int, float]]:
    import json

    return [(r["step"], r["loss"]) for r in map(json.loads, (out / "steps.jsonl").open())]


def test_a_training_run_killed_between_saves_resumes_with_the_same_losses(tmp_path):
    """scripts/train.py: a run that died after its last save (steps 4 and 5 logged, not saved)
    resumes from that save, on another number of ranks, runs those steps again and ends with
    the losses of the run that was never interrupted; other arguments are refused."""
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    res = _train(straight, "--world", "2", "--steps", "6")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step     6/6  loss" in res.stdout and "from the start" in res.stdout, res.stdout
    want = _losses(straight)
    assert [s for s, _ in want] == list(range(6)) and want[-1][1] < want[0][1], want
    assert _train(broken, "--world", "2", "--steps", "4").returncode == 0
    with (broken / "steps.jsonl").open("a") as f:  # what a run killed before step 6's save left
        f.write('{"step": 4, "loss": 99.0}\n{"step": 5, "loss": 99.0}\n{"step": 6, "lo')
    res = _train(broken, "--world", "1", "--steps", "6")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming at step 4" in res.stdout, res.stdout
    got = _losses(broken)
    assert [s for s, _ in got] == list(range(6)), got
    # one CP group of 1 instead of 2: the same tokens, summed in another order
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-10, (got, want)
    res = _train(broken, "--world", "1", "--steps", "8", "--lr", "0.1")
    assert res.returncode != 0 and "lr: 0.003 then, 0.1 now" in res.stderr, res.stderr[-3000:]
    # a CP degree that does not divide the world is refused before run.json is written
    res = _train(tmp_path / "bad", "--world", "3", "--cp-degree", "2", "--steps", "1")
    assert res.returncode != 0 and "does not divide the world of 3" in res.stderr, res.stderr
    assert not (tmp_path / "bad").exists()
    # 2 DP groups of 1 sequence each: another global batch, so not the same run
    res = _train(broken, "--world", "2", "--cp-degree", "1", "--steps", "8")
    assert res.returncode != 0 and "global_batch: 1 then, 2 now" in res.stderr, res.stderr[-3000:]
