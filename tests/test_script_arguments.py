"""The benchmark and GPU-check scripts refuse bad arguments in one line, before any work: no
traceback, no empty table, no silent fallback to a default. Each script's main() runs in this
process (one import per script, not a Python start per case)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def scripts():
    """name -> the script loaded as a module, scripts/ on the path (for its _args import)."""
    loaded = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "scripts"))

        def load(name):
            if name not in loaded:
                spec = importlib.util.spec_from_file_location(name[:-3], ROOT / "scripts" / name)
                mod = importlib.util.module_from_spec(spec)
                mp.setitem(sys.modules, name[:-3], mod)  # dataclasses look their module up
                spec.loader.exec_module(mod)
                loaded[name] = mod
            return loaded[name]

        yield load


@pytest.mark.parametrize(("script", "args", "message"), [
    ("bench_methods.py", ["--methods", "brust"], "unknown --methods 'brust'; valid: 'burst'"),
    ("bench_methods.py", ["--methods", "ring", "brust"], "unknown --methods 'brust'"),
    ("bench_methods.py", ["--repeats", "0"], "argument --repeats: '0' is not a whole number"),
    ("bench_methods.py", ["--world", "0"], "argument --world: '0' is not a whole number"),
    ("bench_methods.py", ["--tokens", "100"], "sequence length 100 is not divisible by 8"),
    ("bench_methods.py", ["--world", "1"], "leave these methods out with --methods"),
    ("bench_methods.py", ["--methods", "zigzag_ring", "--no-causal"],
     "leave these methods out with --methods"),
    ("bench_ring_compute.py", ["--rank", "5"], "--rank 5 is not a rank of every world"),
    ("bench_ring_compute.py", ["--rank", "-1"], "--rank -1 is not a rank of every world"),
    ("bench_ring_compute.py", ["--dtype", "float33"], "invalid choice: 'float33'"),
    ("bench_ring_compute.py", ["--layout", "zigzg"], "invalid choice: 'zigzg'"),
    ("bench_ring_compute.py", ["--repeats", "0"], "argument --repeats: '0' is not a whole"),
    ("bench_ring_compute.py", ["--seq-local", "3"], "--seq-local 3 is not a multiple of 2"),
    ("bench_precision.py", ["--worlds", "0"], "argument --worlds: '0' is not a whole number"),
    ("bench_precision.py", ["--seeds", "0"], "argument --seeds: '0' is not a whole number"),
    ("bench_window_plan.py", ["--seq-local", "0"], "argument --seq-local: '0' is not a whole"),
    ("bench_window_plan.py", ["--seq-local", "3"], "--seq-local 3 is odd"),
    ("bench_window_plan.py", ["--repeats", "0"], "argument --repeats: '0' is not a whole"),
    ("bench_window_plan.py", ["--big", "1"], "--big 1 is too short"),
    ("gpu_check.py", ["--budget-s", "0"], "argument --budget-s: '0' is not a finite number"),
    ("gpu_check.py", ["--budget-s", "-5"], "argument --budget-s: '-5' is not a finite number"),
    ("gpu_check.py", ["--sections", "bogus"], "unknown sections ['bogus']; valid: tests"),
    ("gpu_check.py", ["--sections", ","], "--sections names no section"),
    ("bench_engine_memory.py", ["--repeats", "0"], "argument --repeats: '0' is not a whole"),
    ("bench_engine_memory.py", ["--seq", "6"], "--seq 6: checkpointing 'selective_half' halves"),
    ("bench_engine_memory.py", ["--seq", "8", "--quick"], "--seq 8 (/4 with --quick): "),
    # (0 tokens passed the length check, and table 1 ran before table 2 died: an audit)
    ("bench_engine_memory.py", ["--seq", "2", "--quick"], "sequence length 0 must be >= 1"),
    ("train.py", ["--steps", "0"], "argument --steps: '0' is not a whole number >= 1"),
    ("train.py", ["--doc-len", "0"], "argument --doc-len: '0' is not a whole number"),
    ("train.py", ["--kv-heads", "0"], "argument --kv-heads: '0' is not a whole number"),
    ("train.py", ["--lr", "-1"], "argument --lr: '-1' is not a finite number > 0"),
    ("train.py", ["--lr", "nan"], "argument --lr: 'nan' is not a finite number > 0"),
    ("train.py", ["--weight-decay", "-1"], "--weight-decay: '-1' is not a finite number >= 0"),
    ("train.py", ["--time-limit-min", "0"], "argument --time-limit-min: '0' is not a finite"),
    ("train.py", ["--async-save"], "--async-save needs --sharded-state"),
    *([("train.py", ["--device", "cuda"], "torch sees no CUDA device")]
      if not torch.cuda.is_available() else []),
])
def test_bad_arguments_are_refused(script, args, message, tmp_path, scripts, capsys):
    if script in ("gpu_check.py", "train.py"):  # a folder of the test's own, should a run start
        args = ["--out", str(tmp_path / "out"), *args]
    with pytest.raises(SystemExit) as e:  # any other exception (a traceback) fails the test
        scripts(script).main(args)
    assert e.value.code == 2  # argparse's usage error, not a failed run
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--record", "--trials", "0"]])
def test_the_time_gate_refuses_zero_repeats_or_trials(args, capsys):
    """A StatisticsError's traceback before (an audit)."""
    from suites import timegate

    with pytest.raises(SystemExit) as e:
        timegate.main(args)
    assert e.value.code == 2 and "give a whole number >= 1" in capsys.readouterr().err


def test_train_refuses_a_window_that_no_layer_has_and_a_sweeps_run_folder(tmp_path, scripts):
    """Found by a bad-input audit: --global-every 1 made every layer global, so --window was
    dropped without a word (the run trained with no window; a sweep spec refuses the same);
    and an --out that holds a burst-bench sweep run had its run.json (the sweep's spec and
    provenance) replaced by the training run's arguments."""
    train = scripts("train.py")
    with pytest.raises(SystemExit, match="--global-every 1: every layer would be global, so "
                       "--window 16 would apply to none; drop --window, or give 2"):
        train.main(["--out", str(tmp_path / "a"), "--window", "16", "--global-every", "1"])
    assert not (tmp_path / "a").exists()
    sweep = tmp_path / "sweep_run"
    sweep.mkdir()
    (sweep / "run.json").write_text('{"sweep": "smoke", "run_id": "r1"}')
    with pytest.raises(SystemExit, match="is a burst-bench sweep run's"):
        train.main(["--out", str(sweep)])
    assert (sweep / "run.json").read_text() == '{"sweep": "smoke", "run_id": "r1"}'
