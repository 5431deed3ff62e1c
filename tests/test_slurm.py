"""Submitit on a real single-node SLURM (issue 5): plain job, job array, 2- and 4-task gloo jobs
running BurstAttention, and the timeout path.

Needs ``scripts/slurm_local.sh up`` (``.ci/run`` does it); skips with the reason otherwise.
Jobs of one test are submitted together and collected afterwards, so the test waits for the
slowest job rather than the sum.
"""

from __future__ import annotations

import subprocess

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


@pytest.mark.parametrize("tasks", [2, 4])
def test_multitask_gloo_burst_attention(slurm_executor, tasks):
    job = slurm_executor(tasks_per_node=tasks).submit(attention_on_ranks, seed=tasks)
    results = job.results()
    assert len(results) == tasks
    assert sorted(r["rank"] for r in results) == list(range(tasks))
    for r in results:
        assert r["world"] == tasks
        assert r["env_rank"] == r["rank"]
        assert r["job_id"] == job.job_id
        for name in ("out", "dq", "dk", "dv"):
            assert r[name] < F32_TOL, f"rank {r['rank']} {name} error {r[name]:.2e}"
    assert len({r["master_addr"] for r in results}) == 1
    assert sacct_state(job.job_id) == "COMPLETED"


def test_timeouts(slurm_executor, tmp_path):
    """Both ways a job ends by its time limit, run side by side.

    - warned: submitit's time-limit warning (SIGUSR2) reaches a job that can react; it ends with
      submitit's "timed-out" error (sacct FAILED). The limit is several minutes and the warning
      is sent by hand (DESIGN.md 6): with a short limit SLURM would signal almost at once. Under
      10 minutes submitit counts any run as timed out, so the job does not requeue.
    - killed: a job deaf to the warning (a rank stuck in a collective) is killed by SLURM when
      its time limit passes (moved to now); sacct says TIMEOUT and submitit reports the state.
    """
    from submitit.core.utils import UncompletedJobError

    ex = slurm_executor(timeout_min=JOB_TIMEOUT_MIN)
    warned = ex.submit(wait_then_sleep, str(tmp_path / "warned"), 600)
    killed = ex.submit(wait_then_sleep, str(tmp_path / "killed"), 600, deaf=True)
    wait_for_file(tmp_path / "killed", timeout_s=60, job=killed)
    expire_time_limit(killed.job_id)
    wait_for_file(tmp_path / "warned", timeout_s=60, job=warned)
    warned._interrupt(timeout=True)

    with pytest.raises(UncompletedJobError, match="timed-out"):
        warned.result()
    assert sacct_state(warned.job_id) == "FAILED"
    # poll accounting ourselves: submitit's own polls back off to one every ~15 s by now
    assert sacct_state(killed.job_id, wait_s=90) == "TIMEOUT"
    killed.get_info(mode="force")
    with pytest.raises(UncompletedJobError, match=r"state: TIMEOUT"):
        killed.result()
    # nothing keeps running after either timeout
    queue = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True)
    assert not {warned.job_id, killed.job_id} & set(queue.stdout.split())
