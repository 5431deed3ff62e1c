"""scripts/gpu_check.py checks itself on CPU (issue 8): the whole flow at tiny sizes (--dry-run)
writes schema rows for every section, JSONL and CSV agree, and the table is printed; without a
GPU and without --dry-run it says so in one line and exits 0."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from results import store
from results.schema import COLUMNS, STATUSES

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _module(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", mod)  # dataclasses look their module up
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its _args, as when run as a script
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of GPU-less machines")
def test_repeat_times_only_the_calls_after_the_warm_up():
    """burst.timing.repeat (gpu_check's timer): ``repeats`` times, none of them the cold first
    call (timed, it made the max 20x the warm calls': a mutation audit)."""
    import time

    from burst.timing import repeat

    calls = []

    def call():
        calls.append(1)
        time.sleep(0.2 if len(calls) == 1 else 0.001)

    times = repeat(call, "cpu", warmup=1, repeats=3)
    assert len(calls) == 4 and len(times) == 3
    assert max(times) < 0.1
    # each time is its own call's, in order (a clock started after the call read ~1e-6 s:
    # every CPU row's time, tokens/s and TFLOP/s with it; the harness tests fake the clock)
    from burst.timing import time_calls

    short, long_ = time_calls([lambda: time.sleep(0.01), lambda: time.sleep(0.05)], "cpu")
    assert short >= 0.01 and long_ >= 0.05 and min(times) >= 0.001


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    mod = _module(monkeypatch)
    assert mod.main(["--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA device" in out[0]
    assert f"torch {torch.__version__}" in out[0] and sys.executable in out[0]  # which one
    assert not (tmp_path / "x").exists()


def test_the_shell_entry_names_the_interpreters_it_tried_when_none_has_torch(tmp_path):
    """It said "expandable_segments probe failed", then "timeout: failed to run command
    '.venv/bin/python'" and exit 127, in a checkout without .venv and a python3 without torch."""
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--out",
                        str(tmp_path / "x")], env={"PATH": "/usr/bin:/bin",
                                                   "PYTHON": str(tmp_path / "no-python")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert f"no Python with torch (tried PYTHON={tmp_path / 'no-python'})" in r.stderr


def test_a_broken_cuda_context_ends_the_cuda_work_with_rows(monkeypatch):
    """After a sticky CUDA fault every later guarded call is a skipped row naming it, and the
    allocator cleanup that would raise then cannot end the run."""
    mod = _module(monkeypatch)

    def fault():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    def cleanup():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", cleanup)
    status, _, err = mod._guard(fault)
    assert status == "error" and "illegal memory access" in err
    status, value, err = mod._guard(lambda: 1)
    assert (status, value) == ("skipped", None)
    assert err == "the CUDA context broke earlier: CUDA error: an illegal memory access was " \
                  "encountered"


def test_cudnn_kernels_run_after_every_other_kernel_at_every_length(tmp_path, monkeypatch):
    mod = _module(monkeypatch)

    def nothing(*_):
        return None

    monkeypatch.setattr(mod, "_kernel_impls", lambda sz: {
        "a": (nothing, nothing), "a[cudnn]": (nothing, nothing), "b": (nothing, nothing)})
    rows = mod.Rows(tmp_path, {})
    mod.section_kernel(rows, mod.DRY, mod.Budget(60.0))
    order = [(r["method"], r["seq_len"]) for r in rows.written if r["label"].endswith(" fwd")]
    n1, n2 = mod.DRY.kernel_seqs
    assert order == [("a", n1), ("b", n1), ("a", n2), ("b", n2), ("a[cudnn]", n1),
                     ("a[cudnn]", n2)]


def test_the_pytest_rows_count_every_gpu_the_tests_could_use(tmp_path, monkeypatch):
    """Every row said device_count=1, also the GPU tests', whose NCCL test spawns a rank on each
    of up to 4 GPUs (an NCCL review): the summary now says how many GPUs pytest saw, and a
    test's row None where more than one was there to use (a test uses one, the NCCL test up
    to 4); the other sections run on one GPU and keep 1."""
    import dataclasses

    mod = _module(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)

    def pytest_run(cmd, timeout, cwd, env):
        junit = Path(next(a for a in cmd if a.startswith("--junitxml=")).split("=", 1)[1])
        junit.write_text('<testsuite><testcase classname="t" name="nccl" time="1"/></testsuite>')
        return subprocess.CompletedProcess(cmd, 0, "1 passed\n", "")

    monkeypatch.setattr(mod, "_run_in_group", pytest_run)
    rows = mod.Rows(tmp_path, {"device_count": 1})
    gpu = dataclasses.replace(mod.DRY, device="cuda")
    mod.section_tests(rows, gpu, mod.Budget(60.0), tmp_path, dry=False)
    assert [(r["label"], r["status"], r["device_count"]) for r in rows.written] == [
        ("t::nccl", "ok", None), ("pytest -m gpu (summary)", "ok", 4)]
    rows.written.clear()
    mod.section_tests(rows, gpu, mod.Budget(60.0), tmp_path, dry=True)  # no GPU in a dry run
    assert {r["device_count"] for r in rows.written} == {1}


def test_the_cudnn_gqa_probe_is_skipped_near_the_deadline(tmp_path, monkeypatch):
    """Building cuDNN graphs for new shapes takes seconds: with under 20 s left in its section
    the probe writes a skipped row and touches no device (a GPU-path review)."""
    import dataclasses

    mod = _module(monkeypatch)
    monkeypatch.setattr(mod.torch.cuda, "get_device_capability", lambda *_: (9, 0))
    rows = mod.Rows(tmp_path, {})
    budget = mod.Budget(100.0)  # the run has time, the kernel section does not (a review)
    budget.enter("kernel", 15.0)
    mod._cudnn_gqa_probe(rows, dataclasses.replace(mod.FULL, device="cuda"), budget)
    (row,) = rows.written
    assert row["status"] == "skipped" and "s left in the kernel section (< 20 s)" in \
        row["error"], row


def test_a_section_keeps_the_time_of_the_sections_after_it(monkeypatch):
    mod = _module(monkeypatch)
    b = mod.Budget(100.0, t0=0.0)
    monkeypatch.setattr(mod.time, "monotonic", lambda: 10.0)
    b.enter("engine", 80.0, reserve=30.0)  # 90 s left globally, the kernel section keeps 30
    assert b.section_end == 70.0 and b.left() == 60.0
    b.enter("kernel", 80.0)
    assert b.section_end == 90.0




def test_the_simulator_comparison_names_exact_gpus_and_never_breaks_a_section(monkeypatch):
    """Only a GPU its profile describes is compared (a GH200 is not an H200, an A100 40GB not
    the 80GB profile); a prediction that cannot be made (no tomllib/tomli on the machine's own
    Python: the simulator's profiles cannot be read) is an error inside the row, not a
    section that dies."""
    mod = _module(monkeypatch)
    full = mod.FULL
    assert mod.sim_profile(full, "NVIDIA H200") == "h200"
    assert mod.sim_profile(full, "NVIDIA A800-SXM4-80GB") == "a800"
    for other in ("NVIDIA GH200 480GB", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 PCIe",
                  "NVIDIA H200 NVL", "NVIDIA L40S"):
        assert mod.sim_profile(full, other) is None, other
    row = dict(workload="kernel", seq_len=256, heads=2, head_dim=16, dtype="float32")
    assert mod._simulated(mod.DRY, row)["simulated"]["status"] == "ok"
    monkeypatch.setitem(sys.modules, "suites.simulate", None)  # its import now fails
    sim = mod._simulated(mod.DRY, row)["simulated"]
    assert sim["profile"] == "h200" and sim["error"].startswith("ModuleNotFoundError")


def test_dry_run_writes_rows_for_every_section(tmp_path):
    out = tmp_path / "gpu"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    with open(out / "rows.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(rows) == len(table) > 10
    assert list(table[0]) == list(COLUMNS)
    for r in rows:
        assert set(r) == set(COLUMNS)
        assert r["status"] in STATUSES, r
        assert r["status"] != "error", r["error"]
        assert r["source"] == "measured" and r["sweep"] == "gpu_check" and r["date"]
    by = {}
    for r in rows:
        by.setdefault(r["workload"], []).append(r)
    assert {"gpu_tests", "kernel", "ring_emulation", "train_step", "max_seq"} <= set(by)
    # the GPU tests ran through pytest and were skipped with the reason (no CUDA in a dry run)
    tests = [r for r in by["gpu_tests"] if r["method"] == "pytest"]
    assert tests and all(r["status"] == "skipped" and "CUDA" in r["error"] for r in tests)
    summary = [r for r in by["gpu_tests"] if "summary" in r["label"]]
    assert summary and summary[0]["status"] == "ok"
    # measured sections: real numbers under the schema's columns
    ours = [r for r in by["kernel"] if r["method"] == "burst.kernel" and r["status"] == "ok"]
    assert ours and all(r["time_s"] > 0 and r["attn_tflops"] > 0 for r in ours)
    # each rate is its own arithmetic (a ratio turned upside down, or GFLOP/s written as
    # TFLOP/s, passed: a test audit): the kernel convention's FLOPs of the pass over the time,
    # and the speedup torch SDPA's time at that length and pass over ours
    from burst import flops

    sdpa = {(r["seq_len"], r["label"].split(" ", 1)[1]): r["time_s"] for r in by["kernel"]
            if r["method"] == "torch_sdpa" and r["status"] == "ok"}
    for r in ours:
        pas = r["label"].split(" ", 1)[1]
        fl = flops.attention_kernel_flops(1, r["seq_len"], r["heads"], r["head_dim"], True)
        fl /= 1 if pas == "fwd+bwd" else 1 + flops.BACKWARD_OVER_FORWARD
        assert json.loads(r["spec"])["flops"] == pytest.approx(fl, rel=1e-12)
        assert r["attn_tflops"] == pytest.approx(fl / r["time_s"] / 1e12, rel=1e-9)
        assert r["tokens_per_s"] == pytest.approx(r["seq_len"] / r["time_s"], rel=1e-9)
        assert r["speedup"] == pytest.approx(sdpa[r["seq_len"], pas] / r["time_s"], rel=1e-9)
    assert any(r["status"] == "ok" for r in by["ring_emulation"])
    (stand_in,) = [r for r in by["ring_emulation"] if r["label"].startswith("stand-in out")]
    assert stand_in["status"] == "ok" and stand_in["time_s"] > 0
    assert json.loads(stand_in["spec"])["share_of_backward_at_most"] > 0
    (probe,) = [r for r in by["kernel"] if r["method"] == "cudnn_gqa_probe"]
    assert probe["status"] == "skipped" and "sm90" in probe["error"]  # no GPU in a dry run
    steps = [r for r in by["train_step"] if r["status"] == "ok"]
    assert steps and all(r["tokens_per_s"] > 0 and r["tflops_model_flops_causal"] > 0
                         for r in steps)
    from burst.engine.configs import get_config

    for r in steps:
        fl = flops.model_flops(get_config(r["model"]), 1, r["seq_len"], "model_flops_causal",
                               r["checkpointing"])
        assert r["tokens_per_s"] == pytest.approx(r["seq_len"] / r["time_s"], rel=1e-9)
        assert r["tflops_model_flops_causal"] == pytest.approx(fl / r["time_s"] / 1e12,
                                                               rel=1e-9)
    assert {r["checkpointing"] for r in by["train_step"]} >= {"none", "full"}
    # every measured engine step and kernel of ours carries the simulator's prediction for it
    # (a CPU priced as the h200 profile here: the path, not the model)
    for r in steps + ours:
        sim = json.loads(r["spec"])["simulated"]
        assert sim["profile"] == "h200" and sim["status"] == "ok" and sim["time_s"] > 0, sim
        assert sim["reserved_bytes"] > 0 and 0 < sim["forward_s"] < sim["time_s"]
    # the table, then each of those rows measured over simulated
    lines = res.stdout.splitlines()
    sim_at = next(i for i, x in enumerate(lines) if x.startswith("simulator (h200 profile)"))
    assert "workload" in lines[sim_at - len(rows) - 2]
    assert not any("simulated" in r["spec"] for r in by["train_step_warmup"])
    priced = [r for r in rows if r["status"] in ("ok", "oom") and "simulated" in r["spec"]]
    assert len(lines) - sim_at - 2 == len(priced) >= len(steps) + len(ours)

    # --show prints the finished run again: its table, its predictions, and today's
    shown = subprocess.run([sys.executable, str(SCRIPT), "--show", str(out)], capture_output=True,
                           text=True, timeout=120, cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    again = shown.stdout.splitlines()
    assert f"{len(rows)} rows" in again[0]
    assert again[1:len(rows) + 3] == lines[sim_at - len(rows) - 2:sim_at], "the same table"
    then = again.index("simulator (h200 profile) against this run (as predicted then), measured"
                       " / simulated (dry run: a CPU priced as that GPU, the path checked, not "
                       "the model)")
    assert again[then + 1:then + 2 + len(priced)] == lines[sim_at + 1:]
    now = next(i for i, x in enumerate(again) if "(the profile as it is now)" in x)
    assert len(again) - now - 2 == len(priced)
    # the profile is the same file, so today's predictions are the run's own
    assert again[now + 1:] == lines[sim_at + 1:]
    # the results store reads the folder as a run (burst-bench show): one id per measurement
    ids = [r["cell_id"] for r in rows]
    assert all(ids) and len(set(ids)) == len(ids) == len(store.consolidate(out, write=False))
    assert store.read_meta(out)["sweep"] == "gpu_check" and store.read_meta(out)["created"]
    missing = subprocess.run([sys.executable, str(SCRIPT), "--show", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert missing.returncode == 2 and "no " in missing.stderr


def test_row_ids_name_what_was_measured_and_never_collide(monkeypatch):
    mod = _module(monkeypatch)
    row = dict(sweep="gpu_check", workload="kernel", label="burst.kernel fwd", seq_len=32768)
    first = mod.row_id(row)
    assert mod.row_id(dict(row, time_s=1.0, date="x")) == first  # a result is not its identity
    assert mod.row_id(dict(row, seq_len=65536)) != first
    assert mod.row_id(row, {first}) == f"{first}-2"
    assert mod.row_id(row, {first, f"{first}-2"}) == f"{first}-3"


def test_the_kept_gpu_runs_read_as_runs_in_the_order_they_ran():
    """results/gpu's runs are read by the results store (burst-bench show, the figures' scan of
    results/), each row kept, the earlier run first."""
    folder = REPO / "results" / "gpu"
    runs = store.runs_by_time(folder)
    assert [p.name for p in runs] == ["h200_20261204_flash", "h200_20261204_cudnn"]
    for run in runs:
        rows = store.read_rows(run / "rows.jsonl")
        assert len(store.consolidate(run, write=False)) == len(rows) > 90


# a child that starts a grandchild (as pytest starts NCCL ranks), writes its pid, and waits
PARENT_OF_SLEEPER = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                     "'import time; time.sleep(60)']); open(sys.argv[1], 'w').write(str(p.pid)); "
                     "time.sleep(60)")


def _assert_gone(pid: int, what: str) -> None:
    """The process ends within 10 s (a zombie is dead: init reaps it later)."""
    import os
    import time

    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return
        except (ProcessLookupError, FileNotFoundError):
            return
        assert time.monotonic() < deadline, f"the spawned child outlived {what}"
        time.sleep(0.1)


def test_a_timed_out_pytest_takes_the_ranks_it_spawned_with_it(tmp_path, monkeypatch):
    """Only pytest was killed at the section's budget: the NCCL ranks a test had spawned kept
    running and held the GPUs for the later sections."""
    import time

    mod = _module(monkeypatch)
    pidfile = tmp_path / "child.pid"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        mod._run_in_group([sys.executable, "-c", PARENT_OF_SLEEPER, str(pidfile)], timeout=10.0)
    assert time.monotonic() - t0 < 40
    _assert_gone(int(pidfile.read_text()), "the timeout")


def test_an_interrupted_gpu_check_takes_the_pytest_group_with_it(tmp_path, monkeypatch):
    """pytest runs in its own session (so a time-out can kill its group): SIGTERM or Ctrl-C to
    gpu_check then reached neither pytest nor its ranks, which ran on holding the GPUs."""
    import os
    import signal
    import threading
    import time

    mod = _module(monkeypatch)
    pidfile = tmp_path / "child.pid"

    def terminate_once_started():  # as `timeout` or SLURM would, once the child is up
        deadline = time.monotonic() + 50
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, mod._interrupt)  # what main() installs
    try:
        threading.Thread(target=terminate_once_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            mod._run_in_group([sys.executable, "-c", PARENT_OF_SLEEPER, str(pidfile)],
                              timeout=60.0)
    finally:
        signal.signal(signal.SIGTERM, old)
    _assert_gone(int(pidfile.read_text()), "the interrupt")


def test_a_rank_left_behind_by_a_finished_pytest_is_ended(tmp_path, monkeypatch):
    """A test killed by pytest-timeout leaves the rank it spawned running in pytest's session
    (holding the GPU for the later sections) although pytest itself exits normally."""
    mod = _module(monkeypatch)
    pidfile = tmp_path / "child.pid"
    leaver = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)'], stdout=subprocess.DEVNULL, "
              "stderr=subprocess.DEVNULL); open(sys.argv[1], 'w').write(str(p.pid))")
    res = mod._run_in_group([sys.executable, "-c", leaver, str(pidfile)], timeout=30.0)
    assert res.returncode == 0
    _assert_gone(int(pidfile.read_text()), "its pytest")


def test_a_pytest_that_dies_without_junit_keeps_its_finished_tests(tmp_path, monkeypatch):
    """A CUDA abort inside a test ends pytest before its junit file: the tests its progress
    lines name as done were lost, with one summary row."""
    mod = _module(monkeypatch)
    progress = ("tests/test_gpu.py::test_a PASSED                [ 50%]\n"
                "tests/test_gpu.py::test_b FAILED                [100%]\n"
                "Fatal Python error: Aborted\n")
    monkeypatch.setattr(mod, "_run_in_group", lambda cmd, timeout, **kw:
                        subprocess.CompletedProcess(cmd, -6, progress, ""))
    # an earlier run's junit file in a reused --out was read as this run's results
    (tmp_path / "junit_gpu.xml").write_text(
        '<testsuite><testcase classname="tests.test_gpu" name="test_old"/></testsuite>')
    rows = mod.Rows(tmp_path, {})
    mod.section_tests(rows, mod.DRY, mod.Budget(30.0), tmp_path, True)
    got = [(r["label"], r["status"]) for r in rows.written]
    assert got[:2] == [("tests/test_gpu.py::test_a", "ok"), ("tests/test_gpu.py::test_b", "error")]
    assert got[2] == ("pytest -m gpu (summary)", "error")
    assert rows.written[2]["error"] == "pytest wrote no junit file"


def test_the_shell_timeout_follows_the_budget(tmp_path):
    """gpu_check.sh's kill came at 470 s whatever --budget-s said: a larger budget was cut
    before the script's own watchdog could write its rows."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 0\ntr "\\0" " " < /proc/$PPID/cmdline\n')
    fake.chmod(0o755)
    for args, limit in (([], "470"), (["--budget-s", "600"], "620"),
                        (["--budget-s=100.5"], "121")):
        r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args],
                           env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake)},
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.startswith(f"timeout -k 5 {limit} {fake} scripts/gpu_check.py"), r.stdout
