"""Submitit on a real single-node SLURM (issue 5): plain job, job array, 2- and 4-task gloo jobs
running BurstAttention, and the timeout path.

Then a whole sweep through the harness's slurm executor: one job array, one ok row per cell,
and cells killed by SLURM at their time limit becoming ``timeout`` rows.

Needs ``scripts/slurm_local.sh up`` (``.ci/run`` does it); skips with the reason otherwise.
Jobs of one test are submitted together and collected afterwards, so the test waits for the
slowest job rather than the sum.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from pathlib import Path

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
    way, SLURM killing a job deaf to the warning at its limit (sacct: TIMEOUT), is in the
    sweep test below.
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
description = "SLURM integration test: a tiny causal CPU sweep as one job array"
workload = "attention"
device = "cpu"
warmup = 0
repeats = 1
timeout_min = {time_min}
error_max_tokens = 64
profile_memory = false
seq_lens = [32, 64]
world = 2

[shape]
heads = 2
head_dim = 8
causal = true

[[methods]]
name = "burst"
options = {{ layout = "zigzag", backward = "burst" }}
label = "burst"

[[methods]]
name = "tests.slurm_support:stuck_attention"
options = {{ marker_dir = "{markers}" }}
label = "stuck"

[slurm]
partition = "debug"
time_min = {time_min}
cpus_per_task = 1
additional = {{ chdir = "{repo}" }}
"""


def test_sweep_job_array_rows(slurm_cluster, tmp_path):
    """A sweep through the harness's slurm executor: 2 methods x 2 lengths, one job array of
    2-task jobs. The burst cells write ok rows (checked against the float64 reference); the
    cells of a method stuck like a hung collective are killed by SLURM when their time limit
    passes (moved to now) and become timeout rows; the sweep goes on, and resuming the run adds
    no row."""
    from results.store import read_rows
    from suites.cells import expand
    from suites.run import run_sweep
    from suites.spec import load_spec

    markers = tmp_path / "stuck"
    markers.mkdir()
    path = tmp_path / "slurm_sweep.toml"
    path.write_text(SWEEP_TOML.format(markers=markers, repo=REPO, time_min=JOB_TIMEOUT_MIN))
    spec = load_spec(path)
    cells = expand(spec)
    n_stuck = sum(c.label == "stuck" for c in cells)
    jobs, seen, log = [], {"expired": [], "states": {}}, io.StringIO()

    def expire_stuck_jobs():
        try:
            deadline = time.monotonic() + 90
            while len(seen["expired"]) < n_stuck:
                assert time.monotonic() < deadline, f"stuck cells seen: {seen['expired']}"
                for f in markers.iterdir():
                    if f.suffix != ".tmp" and f.name not in seen["expired"]:
                        expire_time_limit(f.name)
                        seen["expired"].append(f.name)
                time.sleep(0.2)
            for job_id in seen["expired"]:
                seen["states"][job_id] = sacct_state(job_id, wait_s=90)
            for j in jobs:  # submitit's shared watcher polls ever more rarely: refresh it now
                j.get_info(mode="force")
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            seen["error"] = repr(e)
            for j in jobs:  # end the sweep now rather than at the time limit
                j.cancel(check=False)

    def on_submit(submitted):
        jobs.extend(submitted)  # (a killed task's missing result file is not waited on)
        threading.Thread(target=expire_stuck_jobs, daemon=True).start()

    kw = dict(executor="slurm", out=tmp_path / "results", job_folder=tmp_path / "jobs",
              stream=log)
    res = run_sweep(spec, on_submit=on_submit, **kw)
    assert "error" not in seen, seen["error"]
    rows = read_rows(res.run_dir / "rows.jsonl")
    assert res.ran == len(cells) == 4
    assert sorted(r["cell_id"] for r in rows) == sorted(c.cell_id for c in cells), log.getvalue()
    # one job array: tasks <array>_<index>, and each row names the task that ran it
    assert len(jobs) == 4 and len({j.job_id.split("_")[0] for j in jobs}) == 1
    assert sorted(r["job_id"] for r in rows) == sorted(j.job_id for j in jobs)
    # each submission has its own folder (job ids restart after SLURM's state is reset), named
    # whole in jobs.jsonl (a relative one was looked for under the resuming driver's cwd)
    folders = {r["folder"] for r in read_rows(res.run_dir / "jobs.jsonl", keys=("cell_id",))
               if "folder" in r}
    assert len(folders) == 1 and all(Path(f).is_absolute() and "/slurm-" in f for f in folders)
    for r in rows:
        assert r["executor"] == "slurm" and r["world"] == 2
        if r["label"] == "burst":
            assert r["status"] == "ok", r["error"]
            assert r["time_s"] > 0 and r["bytes_sent_forward"] > 0
            assert r["max_err"] < F32_TOL
            assert sacct_state(r["job_id"]) == "COMPLETED"
        else:
            assert r["status"] == "timeout", r["error"]
            assert "TIMEOUT" in r["error"]
            assert seen["states"][r["job_id"]] == "TIMEOUT"
    # the run is complete (failed cells count as done): resuming submits nothing, adds no row
    again = run_sweep(spec, run_id=res.run_dir.name, on_submit=jobs.extend, **kw)
    assert again.ran == 0 and len(jobs) == 4
    assert len(read_rows(again.run_dir / "rows.jsonl")) == 4


def test_sweep_resumes_jobs_of_a_dead_driver(slurm_cluster, tmp_path):
    """The driver dies right after submitting its job array (ssh drop): the jobs run on in
    SLURM. The next driver waits for them and writes their rows, submitting nothing new."""
    from results.store import read_rows
    from suites.run import run_sweep
    from suites.spec import load_spec

    text = SWEEP_TOML.format(markers=tmp_path, repo=REPO, time_min=JOB_TIMEOUT_MIN)
    path = tmp_path / "orphans.toml"
    path.write_text(text.split("[[methods]]\nname = \"tests.slurm_support")[0]
                    + text[text.index("[slurm]"):])
    spec = load_spec(path)
    first, later = [], []

    class DriverDied(Exception):
        pass

    def die(jobs):
        first.extend(jobs)
        raise DriverDied

    kw = dict(executor="slurm", out=tmp_path / "results", job_folder=tmp_path / "jobs",
              stream=io.StringIO())
    with pytest.raises(DriverDied):
        run_sweep(spec, on_submit=die, **kw)
    res = run_sweep(spec, on_submit=later.extend, **kw)
    rows = read_rows(res.run_dir / "rows.jsonl")
    assert later == [] and len(first) == 2
    assert sorted(r["job_id"] for r in rows) == sorted(j.job_id for j in first)
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]


def _preempted_once(tmp_path, options: str = ""):
    """Run a one-cell sweep of ``stalled_once_attention`` whose job is preempted as submitit
    simulates it (``job._interrupt()``: the signals a cluster sends a job it preempts): rank 0
    requeues the job and exits, rank 1 loses its connection and writes an error. Returns the
    row, the job and the driver's output."""
    from results.store import read_rows
    from suites.run import run_sweep
    from suites.spec import load_spec

    # a limit of an hour: submitit takes a signal for the time limit once the job has run
    # min(80% of it, all but 10 minutes), at once under 10 minutes (the tests' usual limit)
    text = SWEEP_TOML.format(markers=tmp_path, repo=REPO, time_min=60)
    text = text.replace("seq_lens = [32, 64]", "seq_lens = [32]")
    head, tail = text.split("[[methods]]", 1)
    path = tmp_path / "preempt.toml"
    path.write_text(head + '[[methods]]\nname = "tests.slurm_support:stalled_once_attention"\n'
                    f'options = {{ marker_dir = "{tmp_path}"{options} }}\nlabel = "stalled"\n\n'
                    + tail[tail.index("[slurm]"):])
    spec = load_spec(path)
    jobs, seen = [], {}

    def preempt_once_stalled():
        try:
            wait_for_file(tmp_path / jobs[0].job_id, timeout_s=120, job=jobs[0])
            time.sleep(2)  # (rank 1 is in the collective by then)
            jobs[0]._interrupt()
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            seen["error"] = repr(e)
            jobs[0].cancel(check=False)

    def on_submit(submitted):
        jobs.extend(submitted)
        threading.Thread(target=preempt_once_stalled, daemon=True).start()

    log = io.StringIO()
    res = run_sweep(spec, executor="slurm", out=tmp_path / "results",
                    job_folder=tmp_path / "jobs", stream=log, on_submit=on_submit)
    assert "error" not in seen, seen["error"]
    (row,) = read_rows(res.run_dir / "rows.jsonl")
    assert len(jobs) == 1 and row["job_id"] == jobs[0].job_id  # the same job, run again
    states = subprocess.run(["sacct", "-j", jobs[0].job_id, "-D", "-X", "-n", "-P", "-o",
                             "State"], capture_output=True, text=True).stdout.split()
    assert states[0] == "REQUEUED", states
    return row, jobs[0], log.getvalue()


def _set_aside(tmp_path) -> list[str]:
    """The errors of the job's earlier attempt that the driver set aside."""
    from submitit.core.utils import pickle_load

    return [str(pickle_load(f)[1]) for f in tmp_path.glob("jobs/**/*_result.pkl.attempt-*")]


def test_a_preempted_cell_is_requeued_and_its_row_is_the_next_attempts(slurm_cluster, tmp_path):
    """The driver took the error that rank 1 wrote as the preempted attempt ended for the
    cell's row and cancelled the requeued job (a SLURM audit); it now waits and writes the
    next attempt's row. The error set aside names its attempt, the first."""
    row, job, log = _preempted_once(tmp_path)
    assert row["status"] == "ok", (row["error"], log)
    assert sacct_state(job.job_id) == "COMPLETED"
    aside = _set_aside(tmp_path)
    assert aside and all("SLURM_RESTART_COUNT=0 " in text for text in aside), aside


def test_the_next_attempts_own_error_is_the_row_without_the_controller(
        slurm_cluster, tmp_path, monkeypatch):
    """Where the SLURM controller did not answer, rank 0's log saying "preempted" set every
    result file aside, the next attempt's genuine error too: the row was rank 0's timeout
    waiting on rank 1, 600 s later (seen here), or "no rank left a result". Each error names
    its attempt now: the first attempt's is set aside, the next one's is the row (rank 0's log
    says the job was requeued)."""
    from suites import executors
    from suites.run import short_reason

    monkeypatch.setattr(executors, "_restarts", lambda job: None)
    row, _, log = _preempted_once(tmp_path, ", fail_on_restart = true")
    assert row["status"] == "error", (row, log)
    assert short_reason(row["error"]) == "RuntimeError: rank 1 fails in the job's next attempt"
    assert "rank 1 raised: (in the SLURM job's attempt 1, from 0: requeued)\n" in row["error"]
    aside = _set_aside(tmp_path)
    assert aside and all("SLURM_RESTART_COUNT=0 " in text for text in aside), aside


def test_the_job_arrays_of_a_sweeps_scales_are_queued_together(slurm_cluster, tmp_path):
    """A spec of two scales: the driver waited for the first scale's job array before it
    submitted the second's, so on a cluster each scale paid its own queue wait (a SLURM
    audit). Both arrays are queued before any row is written."""
    from results.store import read_rows
    from suites.run import run_sweep
    from suites.spec import load_spec

    text = SWEEP_TOML.format(markers=tmp_path, repo=REPO, time_min=JOB_TIMEOUT_MIN)
    text = (text.split("[[methods]]\nname = \"tests.slurm_support")[0]
            + text[text.index("[slurm]"):])
    text = text.replace("seq_lens = [32, 64]", "seq_lens = [32]").replace(
        "world = 2\n", "\n[[scales]]\nworld = 2\n\n[[scales]]\nworld = 1\n", 1)
    path = tmp_path / "two_scales.toml"
    path.write_text(text)
    arrays = []

    def on_submit(jobs):  # the rows written by then
        arrays.append(sum(len(read_rows(f)) for f in tmp_path.glob("results/*/*/rows.jsonl")))

    res = run_sweep(load_spec(path), executor="slurm", out=tmp_path / "results",
                    job_folder=tmp_path / "jobs", stream=io.StringIO(), on_submit=on_submit)
    rows = read_rows(res.run_dir / "rows.jsonl")
    assert sorted(r["world"] for r in rows) == [1, 2]
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    assert arrays == [0, 0]  # two arrays, the second submitted before any row


def test_the_driver_says_what_its_jobs_wait_for(slurm_cluster, tmp_path, monkeypatch, capsys):
    """A held job was waited on in silence, for ever (a SLURM audit): the driver now names the
    array it submitted and, when squeue's answer changes, what its jobs wait for, a held job
    by id with how to release it."""
    from results.store import read_rows
    from suites import executors
    from suites.run import run_sweep
    from suites.spec import load_spec

    text = SWEEP_TOML.format(markers=tmp_path, repo=REPO, time_min=JOB_TIMEOUT_MIN)
    text = (text.split("[[methods]]\nname = \"tests.slurm_support")[0]
            + text[text.index("[slurm]"):])
    text = text.replace("seq_lens = [32, 64]", "seq_lens = [32]").replace(
        'additional = {', 'additional = { hold = true, ')  # queued held: sbatch --hold
    path = tmp_path / "held.toml"
    path.write_text(text)
    monkeypatch.setattr(executors, "QUEUE_REPORT_S", 0.2)
    asked = executors._queue_line

    def release_once_said(jobs):
        line = asked(jobs)
        if line and "JobHeldUser" in line:
            subprocess.run(["scontrol", "release", *(str(j.job_id) for j in jobs)], check=True)
        return line

    def release_later(jobs):  # a driver that never says it still ends: released at 60 s
        ids = [str(j.job_id) for j in jobs]
        timer = threading.Timer(60, subprocess.run, args=(["scontrol", "release", *ids],))
        timer.daemon = True
        timer.start()

    monkeypatch.setattr(executors, "_queue_line", release_once_said)
    res = run_sweep(load_spec(path), executor="slurm", out=tmp_path / "results",
                    job_folder=tmp_path / "jobs", stream=io.StringIO(), on_submit=release_later)
    (row,) = read_rows(res.run_dir / "rows.jsonl")
    assert row["status"] == "ok", row["error"]
    out = capsys.readouterr().out
    array = row["job_id"].split("_")[0]
    assert f"submitted job array {array}: 1 cell(s), 1 node(s) x 2 task(s) each" in out
    assert (f"slurm: 1 pending (JobHeldUser): {row['job_id']} (scontrol release <id> lets it "
            "run)") in out, out
