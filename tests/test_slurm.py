"""Submitit on a real single-node SLURM (issue 5): plain job, job array, 2- and 4-task gloo jobs
running BurstAttention, and the timeout path.

Then whole sweeps through the harness's slurm executor: a job array writing one ok row per
cell, and a cell killed by SLURM at its time limit becoming a ``timeout`` row.

Needs ``scripts/slurm_local.sh up`` (``.ci/run`` does it); skips with the reason otherwise.
Jobs of one test are submitted together and collected afterwards, so the test waits for the
slowest job rather than the sum.
"""

from __future__ import annotations

import io
import subprocess
import threading

import pytest

from tests import slurm_support
from tests.slurm_support import (
    JOB_TIMEOUT_MIN,
    REPO,
    attention_on_ranks,
    double,
    expire_time_limit,
    sacct_state,
    wait_for_file,
    wait_then_sleep,
)

pytestmark = pytest.mark.slurm
slurm_cluster = slurm_support.slurm_cluster  # fixtures, used by name
slurm_executor = slurm_support.slurm_executor

F32_TOL = 2e-5  # float32 against the float64 reference, as tests/test_burst_attention.py


def test_plain_job_and_array(slurm_executor):
    ex = slurm_executor()
    job = ex.submit(double, 21)
    array = slurm_executor().map_array(double, [1, 2, 3])
    res = job.result()
    assert res["value"] == 42
    assert res["job_id"] == job.job_id
    assert res["cwd"] == str(REPO)
    assert [j.result()["value"] for j in array] == [2, 4, 6]
    # one array job: tasks share the array's id and carry their own index
    base = {j.job_id.split("_")[0] for j in array}
    assert len(base) == 1
    assert sorted(j.result()["array_task"] for j in array) == ["0", "1", "2"]
    # accounting is what submitit reads job states from (DESIGN.md 6)
    assert sacct_state(job.job_id) == "COMPLETED"
    assert job.get_info(mode="force")["State"] == "COMPLETED"  # submitit sees it too
    assert all(sacct_state(j.job_id) == "COMPLETED" for j in array)


def test_multitask_gloo_burst_attention(slurm_executor):
    """2- and 4-task jobs (submitted together): the ranks of each form a gloo group from the job
    environment and run burst_attn forward+backward against the float64 reference."""
    jobs = {tasks: slurm_executor(tasks_per_node=tasks).submit(attention_on_ranks, seed=tasks)
            for tasks in (2, 4)}
    for tasks, job in jobs.items():
        results = job.results()
        assert len(results) == tasks
        assert sorted(r["rank"] for r in results) == list(range(tasks))
        for r in results:
            assert r["world"] == tasks
            assert r["env_rank"] == r["rank"]
            assert r["job_id"] == job.job_id
            for name in ("out", "dq", "dk", "dv"):
                assert r[name] < F32_TOL, f"{tasks} tasks, rank {r['rank']} {name}: {r[name]:.2e}"
        assert len({r["master_addr"] for r in results}) == 1
        assert sacct_state(job.job_id) == "COMPLETED"


def test_timeout_warning_ends_job(slurm_executor, tmp_path):
    """submitit's timeout path: the time-limit warning (SIGUSR2) ends the job as timed out.

    The limit is several minutes and the warning is sent by hand (DESIGN.md 6): with a short
    limit SLURM would signal almost at once. Under 10 minutes submitit counts any run as timed
    out, so the job raises UncompletedJobError instead of requeueing (sacct: FAILED). The other
    way, SLURM killing a job deaf to the warning at its limit (sacct: TIMEOUT), is the sweep
    test below.
    """
    from submitit.core.utils import UncompletedJobError

    job = slurm_executor(timeout_min=JOB_TIMEOUT_MIN).submit(
        wait_then_sleep, str(tmp_path / "started"), 600)
    wait_for_file(tmp_path / "started", timeout_s=60, job=job)
    job._interrupt(timeout=True)
    with pytest.raises(UncompletedJobError, match="timed-out"):
        job.result()
    assert sacct_state(job.job_id) == "FAILED"
    queue = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True)
    assert job.job_id not in queue.stdout.split()  # nothing keeps running after the timeout


# ---------------------------------------------------------------------------------------------
# whole sweeps through the harness's slurm executor (suites.run.run_sweep)

SWEEP_TOML = """
description = "SLURM integration test: a tiny causal CPU sweep, one job array"
workload = "attention"
device = "cpu"
warmup = 0
repeats = 1
timeout_min = 5
error_max_tokens = 64
profile_memory = false
seq_lens = {seq_lens}
world = 2

[shape]
heads = 2
head_dim = 8
causal = true

[[methods]]
name = "burst"
options = {{ layout = "zigzag", backward = "burst" }}
{extra}
[slurm]
partition = "debug"
time_min = {time_min}
cpus_per_task = 1
additional = {{ chdir = "{repo}" }}
"""


def _sweep(tmp_path, name: str, *, seq_lens, extra: str = ""):
    from suites.spec import load_spec

    path = tmp_path / f"{name}.toml"
    path.write_text(SWEEP_TOML.format(seq_lens=list(seq_lens), extra=extra, repo=REPO,
                                      time_min=JOB_TIMEOUT_MIN))
    return load_spec(path)


def _rows(result) -> list[dict]:
    from results.store import read_rows

    return read_rows(result.run_dir / "rows.jsonl")


def test_sweep_job_array_writes_one_ok_row_per_cell(slurm_cluster, tmp_path):
    from suites.cells import expand
    from suites.run import run_sweep

    spec = _sweep(tmp_path, "slurm_ok", seq_lens=[32, 64])
    cells = expand(spec)
    jobs, log = [], io.StringIO()
    kw = dict(executor="slurm", out=tmp_path / "results", job_folder=tmp_path / "jobs",
              on_submit=jobs.extend, stream=log)
    res = run_sweep(spec, **kw)
    rows = _rows(res)
    assert res.ran == len(cells) == 2
    assert sorted(r["cell_id"] for r in rows) == sorted(c.cell_id for c in cells)
    assert [r["status"] for r in rows] == ["ok", "ok"], log.getvalue()
    # one job array: tasks <array>_<index>, and each row names the task that measured it
    assert len(jobs) == 2 and len({j.job_id.split("_")[0] for j in jobs}) == 1
    assert sorted(r["job_id"] for r in rows) == sorted(j.job_id for j in jobs)
    for r in rows:
        assert r["executor"] == "slurm" and r["world"] == 2
        assert r["time_s"] > 0 and r["bytes_sent_forward"] > 0
        assert r["max_err"] < F32_TOL
    assert all(sacct_state(j.job_id) == "COMPLETED" for j in jobs)
    # the run is complete: running it again (same run folder) submits nothing, adds no row
    again = run_sweep(spec, run_id=res.run_dir.name, **kw)
    assert again.ran == 0 and len(jobs) == 2
    assert len(_rows(again)) == 2


def test_sweep_cell_killed_at_time_limit_is_a_timeout_row(slurm_cluster, tmp_path):
    """One job array, two cells: burst (ok) and a method stuck like a hung collective, which
    SLURM kills when its time limit passes (moved to now); the sweep writes a timeout row for it
    and goes on."""
    from suites.run import run_sweep

    marker = tmp_path / "stuck"
    extra = ('[[methods]]\nname = "tests.slurm_support:stuck_attention"\n'
             f'options = {{ marker = "{marker}" }}\nlabel = "stuck"\n')
    spec = _sweep(tmp_path, "slurm_timeout", seq_lens=[32], extra=extra)
    seen: dict = {}

    def expire_when_stuck(jobs):
        def run():
            try:
                wait_for_file(marker, timeout_s=90)
                job_id = marker.read_text()
                seen["job"] = next(j for j in jobs if j.job_id == job_id)
                expire_time_limit(job_id)
                seen["state"] = sacct_state(job_id, wait_s=90)
                # the shared submitit watcher polls sacct ever more rarely: refresh it now
                seen["job"].get_info(mode="force")
            except BaseException as e:  # noqa: BLE001 - reported by the test below
                seen["error"] = repr(e)
                for j in jobs:  # end the sweep now rather than at the 5-minute limit
                    j.cancel(check=False)

        threading.Thread(target=run, daemon=True).start()

    log = io.StringIO()
    res = run_sweep(spec, executor="slurm", out=tmp_path / "results",
                    job_folder=tmp_path / "jobs", on_submit=expire_when_stuck, stream=log)
    assert "error" not in seen, seen.get("error")
    assert seen["state"] == "TIMEOUT"
    rows = {r["label"]: r for r in _rows(res)}
    assert len(rows) == 2 and "stuck" in rows, log.getvalue()
    stuck = rows.pop("stuck")
    assert stuck["status"] == "timeout", stuck["error"]
    assert "TIMEOUT" in stuck["error"]
    assert stuck["job_id"] == seen["job"].job_id
    (ok,) = rows.values()
    assert ok["status"] == "ok", ok["error"]
