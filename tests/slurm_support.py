"""Fixtures and job functions for the tests that run on a real (local) SLURM (issue 5).

``scripts/slurm_local.sh up`` starts a single-node cluster (DESIGN.md 6); ``.ci/run`` does it
around ``make test`` and exports ``BURST_SLURM=1``. Here:

- ``slurm_cluster`` (session fixture): probes the cluster once; skips every SLURM test with the
  reason when it is not running, but fails when ``BURST_SLURM=1`` promises it is (CI).
- ``slurm_executor`` (fixture): a factory of submitit SLURM executors, each on a fresh folder:
  job ids restart at 1 when the cluster's state is wiped, so a reused folder could return a
  stale result of an earlier job with the same id (DESIGN.md 6).
- job functions (module-level so that submitit pickles them by reference; jobs run with the
  repository as working directory, so ``tests.slurm_support`` imports there).

Time limits are several minutes: with a short limit SLURM sends submitit's warning signal almost
at once (DESIGN.md 6); the timeout path is triggered with ``job._interrupt(timeout=True)``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = [
    "JOB_TIMEOUT_MIN",
    "REPO",
    "SLURM_DIR",
    "attention_on_ranks",
    "cluster_problem",
    "double",
    "expire_time_limit",
    "sacct_state",
    "slurm_cluster",
    "slurm_executor",
    "stalled_once_attention",
    "stuck_attention",
    "wait_for_file",
    "wait_then_sleep",
]

REPO = Path(__file__).resolve().parents[1]
SLURM_DIR = Path(os.environ.get("BURST_SLURM_DIR", "/tmp/burst-slurm"))
PARTITION = "debug"  # the partition scripts/slurm_local.sh defines
JOB_TIMEOUT_MIN = 5
START_HINT = "start it with scripts/slurm_local.sh up (as root)"

# ---------------------------------------------------------------------------------------------
# the cluster probe


def _slurm_conf() -> Path:
    # The client commands read /etc/slurm/slurm.conf; the script links it there unless that
    # path belongs to another setup, in which case SLURM_CONF points the clients at ours.
    ours = SLURM_DIR / "etc" / "slurm.conf"
    etc = Path("/etc/slurm/slurm.conf")
    if "SLURM_CONF" not in os.environ and ours.exists() and not etc.exists():
        os.environ["SLURM_CONF"] = str(ours)
    return Path(os.environ.get("SLURM_CONF", etc))


def _pid_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def cluster_problem() -> str | None:
    """None when the cluster accepts jobs, else why not (for the skip message)."""
    for tool in ("sbatch", "sinfo", "sacct", "scancel"):
        if shutil.which(tool) is None:
            return f"SLURM not installed ({tool} not on PATH); {START_HINT}"
    conf = _slurm_conf()
    if not conf.exists():
        # the clients would retry for 60 s before giving up
        return f"SLURM not configured (no {conf}); {START_HINT}"
    ours = SLURM_DIR / "etc" / "slurm.conf"
    if conf.resolve() == ours.resolve() and not _pid_alive(SLURM_DIR / "run" / "slurmctld.pid"):
        # the local cluster is down: say so now rather than after sinfo's 10 s of retries
        return f"SLURM not running (no slurmctld for {conf}); {START_HINT}"
    try:
        out = subprocess.run(["sinfo", "-h", "-p", PARTITION, "-o", "%T"], capture_output=True,
                             text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return f"SLURM not running (sinfo did not answer within 15 s); {START_HINT}"
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        return f"SLURM not running ({msg[-1] if msg else 'sinfo failed'}); {START_HINT}"
    states = out.stdout.split()
    if not any(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for s in states):
        return (f"SLURM partition {PARTITION!r} has no usable node (states: {states or 'none'}); "
                f"{START_HINT}")
    acct = subprocess.run(["sacct", "-n", "-X", "-o", "JobID", "-S", "now"], capture_output=True,
                          text=True, timeout=15)
    if acct.returncode != 0:
        # without accounting submitit cannot learn job states (DESIGN.md 6)
        return f"SLURM accounting not available ({acct.stderr.strip()}); {START_HINT}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The partition to submit to; skips (or fails under BURST_SLURM=1) without a cluster."""
    problem = cluster_problem()
    if problem is not None:
        if os.environ.get("BURST_SLURM") == "1":
            pytest.fail(f"BURST_SLURM=1 but {problem}")
        pytest.skip(problem)
    return PARTITION


@pytest.fixture
def slurm_executor(slurm_cluster, tmp_path) -> Callable:
    """``make(**params)`` -> a submitit SLURM executor on a fresh folder under tmp_path."""
    import submitit

    count = iter(range(1_000_000))

    def make(*, timeout_min: int = JOB_TIMEOUT_MIN, tasks_per_node: int = 1, **params):
        folder = tmp_path / f"submitit-{next(count)}"
        # cluster named explicitly: AutoExecutor picks SLURM whenever srun exists (DESIGN.md 5)
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
        ex.update_parameters(
            slurm_partition=slurm_cluster, timeout_min=timeout_min, nodes=1,
            tasks_per_node=tasks_per_node, cpus_per_task=1,
            slurm_additional_parameters={"chdir": str(REPO)}, **params)
        return ex

    return make


# ---------------------------------------------------------------------------------------------
# helpers for the parent (test) side


def sacct_state(job_id: str, *, wait_s: float = 20.0) -> str:
    """The job's final state as accounting records it (waits for it to leave the live states)."""
    live = {"PENDING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED", ""}
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                             capture_output=True, text=True, timeout=15)
        state = out.stdout.strip().split("\n")[0].split(" ")[0] if out.stdout.strip() else ""
        if state not in live or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def expire_time_limit(job_id: str) -> None:
    """Move a running job's end to now: SLURM kills it as timed out at its next time-limit check.

    Time limits have minute granularity and slurmctld checks them every 30 s, so this reaches the
    real TIMEOUT state in at most ~35 s (KillWait=5 included) instead of minutes (needs root).
    """
    # slurmctld can refuse an update for a moment (a CI run saw one fail for a task that had
    # just started): try again, and say what it answered when it keeps refusing
    tries = 5
    for _ in range(tries):
        res = subprocess.run(["scontrol", "update", f"JobId={job_id}", "EndTime=now"],
                             capture_output=True, text=True, timeout=15)
        if res.returncode == 0:
            return
        time.sleep(1.0)
    raise RuntimeError(f"scontrol update JobId={job_id} EndTime=now failed {tries} times: "
                       f"{res.stderr.strip() or res.stdout.strip()}")


def wait_for_file(path: Path, *, timeout_s: float, job=None) -> None:
    """Wait until ``path`` exists; fail early with the job's log when the job ends first."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if job is not None and job.done():
            pytest.fail(f"job {job.job_id} ended before writing {path}:\n{job.stderr() or ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# job functions (run on the cluster)


def double(x: int) -> dict:
    """A plain job: the value doubled, and where it ran."""
    import submitit

    env = submitit.JobEnvironment()
    return {"value": 2 * x, "job_id": env.job_id, "array_task": os.environ.get(
        "SLURM_ARRAY_TASK_ID"), "hostname": env.hostname, "cwd": os.getcwd()}


def wait_then_sleep(started: str, seconds: float) -> str:
    """Mark that the job runs (its signal handlers are installed by then), then sleep."""
    Path(started).write_text(os.environ.get("SLURM_JOB_ID", ""))
    time.sleep(seconds)
    return "slept"


def stuck_attention(q, k, v, *, causal: bool, softmax_scale=None, group=None,
                    marker_dir: str = "") -> None:
    """A method (registry signature) that hangs like a rank stuck in a collective.

    Deaf to submitit's time-limit warning, so only SLURM's kill at the time limit ends the job.
    Once stuck, rank 0 creates ``marker_dir/<job id>`` (the array task id, as the harness's
    ``job_id`` column) so the test knows which job to expire.
    """
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if marker_dir and int(os.environ.get("RANK", "0")) == 0:
        from suites.provenance import job_id

        Path(marker_dir, f"{job_id()}.tmp").touch()
        os.replace(Path(marker_dir, f"{job_id()}.tmp"), Path(marker_dir, str(job_id())))
    time.sleep(3600)


def stalled_once_attention(q, k, v, *, causal: bool, softmax_scale=None, group=None,
                           marker_dir: str = "", fail_on_restart: bool = False):
    """A method whose rank 0 stalls in its job's first attempt (creating
    ``marker_dir/<job id>``), where a test preempts the job, and computes in the next one (the
    marker exists); its other ranks wait on rank 0 in the attention's collectives meanwhile.
    ``fail_on_restart``: rank 1 fails in the next attempt instead."""
    from suites.provenance import job_id
    from tests.harness_methods import user_attention

    if fail_on_restart and os.environ.get("SLURM_RESTART_COUNT") and os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 fails in the job's next attempt")
    marker = Path(marker_dir, str(job_id()))
    if int(os.environ.get("RANK", "0")) == 0 and not marker.exists():
        Path(f"{marker}.tmp").touch()
        os.replace(f"{marker}.tmp", marker)
        time.sleep(3600)
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


def attention_on_ranks(seed: int, seq_local: int = 8) -> dict:
    """One task of a multi-task job: join the job's gloo group and run burst_attn on a causal case.

    Every rank builds the same full float64 inputs from ``seed``, takes its zigzag shard, runs
    ``burst_attn`` forward and backward in float32, and returns its max errors against the float64
    single-process reference (forward out and dq/dk/dv), so the parent asserts on all ranks.
    """
    import submitit
    import torch

    from burst import burst_attn, comm
    from burst.layout import shard
    from burst.reference import reference_attention

    torch.set_num_threads(1)
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    # env:// rendezvous at the exported MASTER_ADDR/PORT (the node name: it must resolve)
    comm.init("gloo", rank=env.rank, world_size=env.world_size, timeout_s=60)
    try:
        world, rank = comm.world_size(), comm.rank()
        g = torch.Generator().manual_seed(seed)
        n, b, h, hk, d = seq_local * world, 1, 4, 2, 8
        q = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
        k = torch.randn(b, n, hk, d, generator=g, dtype=torch.float64)
        v = torch.randn(b, n, hk, d, generator=g, dtype=torch.float64)
        do = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        out_ref, _ = reference_attention(*ref, causal=True)
        out_ref.backward(do)
        loc = [shard(t.float(), layout="zigzag").requires_grad_() for t in (q, k, v)]
        out = burst_attn(*loc, causal=True, layout="zigzag")
        out.backward(shard(do.float(), layout="zigzag"))

        def err(a, full):
            return float((a.double() - shard(full.detach(), layout="zigzag")).abs().max())

        return {
            "rank": rank, "world": world, "env_rank": env.rank, "master_addr": env.master_addr,
            "job_id": os.environ.get("SLURM_JOB_ID"), "out": err(out, out_ref),
            "dq": err(loc[0].grad, ref[0].grad), "dk": err(loc[1].grad, ref[1].grad),
            "dv": err(loc[2].grad, ref[2].grad),
        }
    finally:
        comm.destroy()
