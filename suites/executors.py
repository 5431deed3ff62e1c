"""Executors: where the cells of a sweep run (issue 5, "Executors").

- ``inline`` (default, nothing to install): ``burst.spawn`` starts the ranks of one scale as
  local processes (gloo on CPU, NCCL on GPU) and runs all its cells in that one group; rank 0
  appends each row as soon as its cell is measured. A cell that fails (exception on any rank, a
  rank dying, OOM, a cell past ``timeout_min``) ends the group; the driver writes that cell's
  failure row and starts a fresh group for the remaining cells.
- ``local``: submitit's LocalExecutor, one job per cell with one task per rank
  (tasks_per_node = world), run one after another (concurrent cells would time each other).
- ``slurm``: submitit on a SLURM cluster (``AutoExecutor(cluster="slurm")``, named explicitly:
  AutoExecutor would pick SLURM on its own whenever ``srun`` is on PATH): one task per GPU,
  nodes x gpus_per_node per cell, the cells of one scale as one job array; partition, account,
  time, constraint from the spec's [slurm] table or the command line.
- ``dry-run``: prints the sbatch script of every job array and the GPU-hours the sweep would
  reserve; submits nothing and writes nothing.

In submitit jobs every task calls ``cell_job``: torch.distributed is set up from
``submitit.helpers.TorchDistributedEnvironment().export()`` (env://; never combined with
torchrun), the cell is measured, and rank 0 returns the row; the driver appends it. Each job
is logged in <run>/jobs.jsonl when submitted and when collected: a driver that dies leaves its
jobs running, and the next driver on that run collects their rows (or waits for them) rather
than running those cells again.

For the SLURM integration tests (and any caller), the entry point is
``suites.run.run_sweep(spec, executor="slurm", out=..., slurm=SlurmSpec(...))``; one level down,
``submit_cells(cells, kind="slurm", run=..., ctx=..., slurm=..., folder=...)`` runs a list of
cells (``suites.cells.expand``) and appends their rows to ``run.rows``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import io
import json
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from burst.spawn import held_signals
from results.store import append_row, read_rows, repair
from suites.cells import Cell
from suites.provenance import code_provenance
from suites.rows import RunContext, classify, failure_row, make_row
from suites.spec import SlurmSpec

__all__ = ["EXECUTORS", "Run", "cell_job", "dry_run", "master_port", "pending_jobs",
           "run_inline", "slurm_parameters", "submit_cells"]

EXECUTORS = ("inline", "local", "slurm", "dry-run")


@dataclass(frozen=True)
class Run:
    """The run folder the rows go to, and what counts as done in it."""

    dir: Path
    start: int = 0
    """Size of rows.jsonl when this driver started: rows after it were written by this run."""
    skip: frozenset = frozenset()
    """Cells done before this run started (their rows are before ``start``)."""

    @property
    def rows(self) -> Path:
        return self.dir / "rows.jsonl"

    def done(self) -> set[str]:
        return set(self.skip) | {r["cell_id"] for r in read_rows(self.rows, self.start)}


def _group_by_scale(cells: list[Cell]) -> list[list[Cell]]:
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.world, c.nodes, c.device), []).append(c)
    return list(groups.values())


def _backend(cell: Cell) -> str:
    return "nccl" if cell.device == "cuda" else "gloo"


# ---------------------------------------------------------------------------------------------
# inline: burst.spawn


CURRENT = "current"  # the state file naming the cell rank 0 is measuring, since when


def _current(state: Path) -> dict | None:
    """What rank 0 wrote in ``CURRENT``: the cell it measures (``cell_id``), since when."""
    try:
        return json.loads((state / CURRENT).read_text())
    except (OSError, ValueError):  # none yet
        return None


def _overdue(state: Path) -> str | None:
    """The driver's time limit of the cell rank 0 is measuring (``CURRENT``): past it, a
    ``timeout-<cell>`` marker and its message, which ends the ranks (``spawn``'s ``watch``);
    kept by the driver, as a timer inside rank 0 could not fire while a hang held its GIL."""
    cur = _current(state)
    if cur is None or time.monotonic() - cur["started"] <= cur["limit_s"]:  # (one clock
        return None                                                         # for every process)
    why = (f"cell {cur['cell_id']} ({cur['what']}) exceeded its time limit of "
           f"{_seconds(cur['limit_s'])} s (timeout_min={cur['timeout_min']})")
    (state / f"timeout-{cur['cell_id']}").write_text(why)
    return why


def _seconds(limit: float) -> str:
    """A time limit as a row says it: whole seconds, or two digits under 10 (1.2 s read "1")."""
    return f"{limit:.0f}" if limit >= 10 else f"{limit:.2g}"


def _inline_ranks(rank: int, world: int, cells_json: list[str], rows: str, ctx: RunContext,
                  state: str) -> None:
    import torch

    from burst import comm
    from suites.measure import measure
    from suites.provenance import host_provenance

    # (a rank dies with a killed driver, as every rank of burst.spawn: it would keep appending
    # rows that the resumed run also produces)
    host = host_provenance(Cell.from_json(cells_json[0]).device) if rank == 0 else None
    for s in cells_json:
        cell = Cell.from_json(s)
        if rank == 0:  # what the driver times (_overdue), replaced whole (never read torn)
            tmp = Path(state) / f"{CURRENT}.tmp"
            tmp.write_text(json.dumps(dict(
                cell_id=cell.cell_id, what=cell.describe(), started=time.monotonic(),
                limit_s=cell.timeout_min * 60, timeout_min=cell.timeout_min)))
            os.replace(tmp, Path(state) / CURRENT)
        torch.manual_seed(cell.seed)
        metrics = measure(cell)
        if rank == 0:
            try:
                append_row(rows, make_row(cell, metrics, ctx, host=host))
            except OSError as e:  # a full or lost disk: the driver stops the sweep (below)
                with contextlib.suppress(OSError):
                    (Path(state) / "write-error").write_text(
                        json.dumps([e.errno, e.strerror or str(e), e.filename or rows]))
                raise
        if cell.device == "cuda":
            gc.collect()  # a train step's model sits in a reference cycle: free it first
            torch.cuda.empty_cache()
        comm.barrier()  # last: a rank that dies before it leaves the next cell unstarted


def run_inline(cells: list[Cell], run: Run, ctx: RunContext) -> None:
    """Run cells on local ranks, one process group per scale; failures become rows."""
    import tempfile

    from burst.spawn import SpawnError, spawn

    for group in _group_by_scale(cells):
        todo = [c for c in group if c.cell_id not in run.done()]
        if todo and todo[0].device == "cuda":
            todo = _skip_if_too_few_gpus(todo, run, ctx)
        while todo:
            with tempfile.TemporaryDirectory(prefix="burst-cells-") as state:
                budget = sum(c.timeout_min * 60 for c in todo) + 120
                try:
                    spawn(_inline_ranks, todo[0].world, backend=_backend(todo[0]),
                          timeout_s=budget, args=([c.to_json() for c in todo], str(run.rows),
                                                  ctx, state),
                          watch=functools.partial(_overdue, Path(state)))
                    failure = None
                except SpawnError as e:
                    failure = str(e)
                repair(run.rows)  # a rank killed mid-write must not tear the next row
                lost = Path(state) / "write-error"
                if lost.exists():  # the row of a cell that ran could not be written: not the
                    # cell's failure (no error row, which a rerun would skip), the sweep's
                    raise OSError(*json.loads(lost.read_text()))
                done = run.done()
                left = [c for c in todo if c.cell_id not in done]
                if left and failure is None:  # cannot happen unless a row write was lost
                    failure = "the ranks finished without writing this cell's row"
                started = (_current(Path(state)) or {}).get("cell_id")
                if left and len(left) < len(todo) and started != left[0].cell_id:
                    todo = left  # the ranks died between two cells: the next one never ran,
                    continue     # so it gets a fresh group, not an error row (a crash audit)
                if left:
                    marker = Path(state) / f"timeout-{left[0].cell_id}"
                    if marker.exists():
                        append_row(run.rows, failure_row(left[0], marker.read_text(), ctx,
                                                         "timeout"))
                    else:
                        append_row(run.rows, failure_row(left[0], failure, ctx))
                    left = left[1:]
                todo = left


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _skip_if_too_few_gpus(cells: list[Cell], run: Run, ctx: RunContext,
                          executor: str = "inline") -> list[Cell]:
    import torch

    have = torch.cuda.device_count()
    if cells[0].world <= have:
        return cells
    for c in cells:
        append_row(run.rows, failure_row(
            c, f"needs {_gpus(c.world)} on this machine ({executor} executor), found {have}; "
               f"resume the run with --retry-failed on a machine with {_gpus(c.world)}, or with "
               "--executor slurm --retry-failed", ctx, "skipped"))
    return []


# ---------------------------------------------------------------------------------------------
# submitit: local and slurm


def cell_job(cell_json: str, ctx: RunContext) -> dict | None:
    """Body of every task of a submitit job: join the group, measure, rank 0 returns the row.
    On SLURM an error names the job's attempt (``attempt_tag``), so the driver tells the errors
    written as a preempted attempt ended from the current one's."""
    try:
        return _cell_task(cell_json, ctx)
    except Exception as e:  # (submitit writes an Exception's traceback; a SystemExit, none)
        if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
            raise
        tag = attempt_tag(int(os.environ.get("SLURM_RESTART_COUNT") or 0))
        if not hasattr(e, "add_note"):  # Python 3.10: the tag as the error's last line
            raise SlurmAttempt(tag) from e
        e.add_note(tag)
        raise


def attempt_tag(attempt: int) -> str:
    """A task's error's last line on SLURM: the job's attempt (SLURM's restart count: SLURM sets
    ``SLURM_RESTART_COUNT`` once it has requeued the job)."""
    return f"{ATTEMPT_NOTE}{attempt} (the SLURM job's attempt, from 0)"


ATTEMPT_NOTE = "SLURM_RESTART_COUNT="


class SlurmAttempt(RuntimeError):
    """Python 3.10's stand-in for an exception note (``add_note``): raised from a task's error
    with ``attempt_tag`` as its message."""


def _cell_task(cell_json: str, ctx: RunContext) -> dict | None:
    import submitit
    import torch

    from burst import comm
    from suites.measure import measure

    cell = Cell.from_json(cell_json)
    os.environ["MASTER_PORT"] = str(master_port(submitit.JobEnvironment().job_id))
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False,
                                                                overwrite=True)
    if env.rank == 0:  # the code this job imports: a shared checkout may have moved since the
        prov = code_provenance(ctx.data_dir)  # driver submitted (hours in a queue)
        if prov["git_commit"]:
            ctx = dataclasses.replace(ctx, **prov)
    device = None
    if cell.device == "cuda":
        # all the node's GPUs visible: the task's own; a cluster that binds one GPU per task
        # shows each task its GPU alone, as cuda:0 (the modulo); bound at init for NCCL
        device = torch.device("cuda", env.local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", 1)))
    # a rank that dies without a word (killed, segfault) is noticed by its peers only through
    # this timeout: keep it well under the job's time limit
    comm.init(_backend(cell), timeout_s=min(cell.timeout_min * 60, 600), device_id=device)
    job_env = submitit.JobEnvironment()
    if env.rank == 0 and job_env.cluster == "local":  # the cell's clock starts (_started_over)
        with contextlib.suppress(OSError):
            (job_env.paths.folder / STARTED).write_text(repr(time.time()))
    torch.manual_seed(cell.seed)
    metrics = measure(cell)  # on failure: no destroy, it would wait for peers that may hang
    comm.destroy()
    return make_row(cell, metrics, ctx) if env.rank == 0 else None


def master_port(job_id: str) -> int:
    """The rendezvous port of one job, the same for all its tasks and below the kernel's
    ephemeral range (Linux: 32768-60999). submitit draws it from 20000-60000, where another
    array task's gloo sockets may already hold it (EADDRINUSE, seen in CI)."""
    return 20000 + zlib.crc32(job_id.encode()) % 12000


def slurm_parameters(cells: list[Cell], slurm: SlurmSpec, *, sweep: str) -> dict:
    """AutoExecutor parameters for the job array of one scale (generic + ``slurm_*``)."""
    c = cells[0]
    gpu = c.device == "cuda"
    params = {
        "name": f"burst-{sweep}", "timeout_min": int(slurm.time_min), "nodes": c.nodes,
        "tasks_per_node": c.ranks_per_node, "gpus_per_node": c.ranks_per_node if gpu else None,
        "cpus_per_task": slurm.cpus_per_task, "mem_gb": slurm.mem_gb,
        "slurm_partition": slurm.partition, "slurm_account": slurm.account,
        "slurm_constraint": slurm.constraint, "slurm_qos": slurm.qos,
        "slurm_array_parallelism": slurm.array_parallelism,
        "slurm_setup": list(slurm.setup) or None,
        "slurm_additional_parameters": dict(slurm.additional) or None,
    }
    return {k: v for k, v in params.items() if v is not None}


def _executor(kind: str, folder: Path, cells: list[Cell], slurm: SlurmSpec, sweep: str):
    import submitit

    ex = submitit.AutoExecutor(folder=folder, cluster=kind)
    if kind == "slurm":
        ex.update_parameters(**slurm_parameters(cells, slurm, sweep=sweep))
    else:  # one machine: every rank a task on it (nodes > 1 only labels links)
        c = cells[0]
        ex.update_parameters(name=f"burst-{sweep}", nodes=1, tasks_per_node=c.world,
                             timeout_min=local_timeout_min(c),
                             gpus_per_node=c.world if c.device == "cuda" else 0)
    return ex


def _outcomes(job) -> dict[int, tuple[str, object]]:
    """{task: ("success", value) | ("error", traceback)} for the tasks that have finished,
    read from their result files (``job.task(i).exception()`` would wait for the whole job)."""
    from submitit.core.utils import pickle_load

    out = {}
    for i in range(job.num_tasks):
        path = job.task(i).paths.result_pickle
        if path.exists():
            with contextlib.suppress(EOFError, OSError):  # being written: next poll
                out[i] = pickle_load(path)
    return out


def _ready(job) -> bool:
    """The cell's outcome is known: rank 0 has its result (its row needs every rank, through
    the final all-reduce), or a rank has failed or vanished (the others may now wait on it
    for ever), or the job ended (and SLURM did not put it back in its queue)."""
    return (_has_outcome(job) or bool(_vanished_local_tasks(job))
            or (job.done() and not _requeued(job)))


_SEEN_LOCAL_TASKS: dict[str, set[int]] = {}
"""Tasks of each local job seen running by an earlier poll (job folder -> task indices)."""

_ALL_STARTED_S = 30.0
"""A local controller this old has started every task: it starts them in one loop, right after
it starts (submitit.local.local.Controller.start_tasks)."""


def _child_pids(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: read every process's parent
        pass
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _running_tasks(pid: int) -> set[int]:
    """Task indices of the local job whose controller is ``pid`` that have a live process."""
    running = set()
    for child in _child_pids(pid):
        with contextlib.suppress(OSError):  # ended meanwhile (a zombie's environ is empty)
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            running |= {int(e.split(b"=", 1)[1]) for e in env
                        if e.startswith(b"SUBMITIT_LOCAL_GLOBALID=")}
    return running


def _age_s(pid: int) -> float:
    """Seconds since process ``pid`` started (0 if it cannot be read)."""
    try:
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0
    return uptime - start / os.sysconf("SC_CLK_TCK")


def _vanished_local_tasks(job) -> list[int]:
    """Tasks of a running local job whose process is gone without a result file: killed
    (SIGKILL, the kernel's OOM killer) or crashed (a segfault). submitit's controller waits
    for every task and reports the job running, so without this the task's peers waited in a
    collective until its timeout (up to 10 min) and the row named no rank.

    A task counts as started once it, or a task after it, has been seen running (the controller
    starts them in order), and every task has once the controller is ``_ALL_STARTED_S`` old. A
    task is gone only if two reads of the process list, 0.2 s apart, both miss it: the kernel's
    children list may miss a child while another starts or exits. Linux only (/proc); [] for
    other jobs."""
    import submitit

    if not isinstance(job, submitit.LocalJob) or not Path("/proc/self").exists():
        return []
    pid = int(job.job_id)
    running = _running_tasks(pid)
    seen = _SEEN_LOCAL_TASKS.setdefault(str(job.paths.folder), set())
    seen |= running
    # an ended job's tasks are judged by _collect; its controller's pid, not job.done(): an
    # adopted job (an earlier driver's) has no process handle and reads as done at once
    if not seen or not local_job_alive(pid, job.paths._folder):  # (the folder as submitted)
        return []
    started = range(job.num_tasks if _age_s(pid) >= _ALL_STARTED_S else max(seen) + 1)
    gone = set(started) - running
    if gone:  # outcomes read after the processes: a task writes its result, then exits
        gone -= set(_outcomes(job))
    if gone:
        time.sleep(0.2)
        gone -= _running_tasks(pid)
        gone -= set(_outcomes(job))  # one the first read missed may have finished since
    return sorted(gone)


def _forget_local_tasks(job) -> None:
    """Drop what the polls saw of a collected local job's tasks."""
    import submitit

    if isinstance(job, submitit.LocalJob):
        _SEEN_LOCAL_TASKS.pop(str(job.paths.folder), None)


# SLURM states of a job that will run (again): after a node failure or a preemption SLURM
# requeues it by default, while submitit counts NODE_FAIL / PREEMPTED as finished
REQUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING",
                   "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED")


def _requeued(job) -> bool:
    """A SLURM job that ended without a result but runs again: a fresh sacct answer (submitit
    caches a finished state for good, so its cache is cleared first) says it is queued or
    running. Asked only of jobs that ended without an outcome, which are few."""
    import submitit

    if not isinstance(job, submitit.SlurmJob):
        return False
    job.watcher.clear()
    return _state(job, mode="force") in REQUEUED_STATES


def _state(job, mode: str = "standard") -> str:
    """The job's state word ("CANCELLED by 0" -> "CANCELLED"; a SLURM job that accounting
    does not report is UNKNOWN); ``mode`` is submitit's sacct mode (force, standard, cache)."""
    import submitit

    raw = (job.watcher.get_state(job.job_id, mode=mode) if isinstance(job, submitit.SlurmJob)
           else job.state)
    return (str(raw or "UNKNOWN").split() or ["UNKNOWN"])[0]


def _failed_first(job, got: dict) -> list[int]:
    """The tasks that raised, the first to fail first (by when their result file was
    written): a rank's error leaves its peers waiting on it, and they fail after it with a
    closed connection, the lowest rank often among them."""
    def written(i: int) -> float:
        try:
            return job.task(i).paths.result_pickle.stat().st_mtime
        except OSError:
            return math.inf

    return sorted((i for i, (o, _) in got.items() if o == "error"), key=lambda i: (written(i), i))


def _reports(got: dict, failed: list[int]) -> str:
    """Every failed rank's traceback, in ``failed``'s order (the cause first: what
    ``suites.run.short_reason`` quotes, and what a clipped error keeps), without its SLURM
    attempt's tag (a requeued job's attempt is said in the rank's line)."""
    def report(i: int) -> str:
        attempt, text = split_attempt(got[i][1])
        when = f" (in the SLURM job's attempt {attempt}, from 0: requeued)" if attempt else ""
        return f"rank {i} raised:{when}\n{text}"  # (suites.rows.REPORT finds "raised:")

    return "\n".join(report(i) for i in failed)


def _collect(job, cell: Cell, run: Run, ctx: RunContext) -> bool:
    """Write the cell's row from its job's outcome; False (nothing written) where the job runs
    again: the errors ``_ready`` saw are an earlier attempt's by now (SLURM requeued it in
    between), and waiting on its result here would stop the driver until the attempt ends."""
    vanished = _vanished_local_tasks(job)
    got = _current_outcomes(job)
    failed = _failed_first(job, got)
    silent = sorted({i for i in range(job.num_tasks) if i not in got and job.task(i).done()}
                    | set(vanished))
    if vanished and not failed and 0 not in got:  # its peers wait on it: do not wait with them
        row = failure_row(cell, f"rank(s) {', '.join(map(str, vanished))} ended without a "
                          "result while the job ran (killed: SIGKILL or the kernel's OOM "
                          "killer, or crashed); the other ranks were cancelled. Logs: "
                          f"{job.paths.folder}", ctx, "error", job_id=str(job.job_id))
    elif failed and silent:  # a rank died without a word (killed, crashed): the others only
        # timed out waiting for it, which is not the cell's timeout
        row = failure_row(cell, f"rank(s) {', '.join(map(str, silent))} ended without a "
                          f"result (killed or crashed); then:\n{_reports(got, failed)}",
                          ctx, "error", job_id=str(job.job_id))
    elif failed:  # the first failed rank's traceback is the cause, the others' follow
        text = _reports(got, failed)
        if TIMED_OUT in str(got[failed[0]][1]):  # submitit's words alone: say which limit
            text = (f"submitit's warning signal ended the cell: the job's time limit "
                    f"({_limit(cell, ctx)}) was {SLURM_SIGNAL_DELAY_S} s or less away, or it was "
                    "preempted (submitit takes a preemption for the time limit, and does not "
                    "requeue the job, once it has run 80% of its limit or all but 10 minutes of "
                    f"it, whichever comes first: always, under a limit of 10 minutes)\n{text}")
        row = failure_row(cell, text, ctx, job_id=str(job.job_id),
                          status=classify(got[failed[0]][1]))
    else:
        from submitit.core.utils import UncompletedJobError

        if 0 not in got and (not job.done() or _requeued(job)):
            return False
        if 0 not in got and _state(job, mode="cache") != "COMPLETED":
            # no result file is coming (the job failed, was cancelled or timed out; a local job
            # never reports COMPLETED, and its files are local): submitit would wait 15 s for
            # one (a shared filesystem's lag), one job after another
            job.task(0)._results_timeout_s = 0
        try:
            row = job.task(0).result()
            if row is None:
                raise RuntimeError("rank 0 returned no row")
            if (row.get("cell_id"), row.get("run_id")) != (cell.cell_id, ctx.run_id):
                # a job id reused after SLURM's state was reset met an old job's result file
                row = failure_row(cell, f"the result file of job {job.job_id} holds the row "
                                  f"of cell {row.get('cell_id')} of run {row.get('run_id')}, "
                                  "not this cell's (a job id reused after SLURM's state was "
                                  "reset?): the cell was not measured", ctx,
                                  "error", job_id=str(job.job_id))
        except UncompletedJobError as e:  # its last line says how the job ended
            row = _uncompleted_row(job, cell, ctx, e, silent)
        except Exception as e:  # noqa: BLE001 - every failure becomes the cell's row
            row = failure_row(cell, f"{type(e).__name__}: {e}", ctx, job_id=str(job.job_id))
    append_row(run.rows, _ran_on(row, job, ctx))
    append_row(run.dir / "jobs.jsonl", {"cell_id": cell.cell_id, "job_id": str(job.job_id),
                                        "collected": True})
    _forget_local_tasks(job)
    if not (failed or silent or vanished) and row.get("status") == "ok":
        _ends_by_itself(job)  # every rank is past the row's last collective
    if not job.done():  # ranks left waiting on a failed one (or stuck): free their slots
        job.cancel(check=False)
    return True


def _ran_on(row: dict, job, ctx: RunContext) -> dict:
    """A row the driver wrote for a job (a failure) with where the job ran: this host (local),
    or SLURM's node list (none for a job that never started). It said "on unknown", and a node
    that fails every job it gets went unseen (a SLURM audit)."""
    import socket

    import submitit

    if row.get("hostname") is not None:
        return row
    if ctx.executor == "local":
        return {**row, "hostname": socket.gethostname()}
    if isinstance(job, submitit.SlurmJob):
        nodes = job.watcher.get_info(job.job_id, mode="cache").get("NodeList", "")
        return {**row, "hostname": None if nodes.startswith("None") else nodes or None}
    return row


FINISH_GRACE_S = 10.0
"""How long a job whose rank 0 reported a good row may take to finish (its other ranks write
their results a moment later) before the driver cancels it: cancelled at once, a rank that had
not yet written its result was killed, and SLURM's accounting called the job CANCELLED (a CI
run saw it)."""


def _ends_by_itself(job, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + FINISH_GRACE_S
    while not job.done() and time.monotonic() < deadline:
        time.sleep(poll_s)


def _task_log(job, i: int) -> str:
    with contextlib.suppress(Exception):  # a log not written (yet), or a job without logs
        return (job.task(i).stdout() or "") + (job.task(i).stderr() or "")
    return ""


def _uncompleted_row(job, cell: Cell, ctx: RunContext, e: Exception, silent: list[int]) -> dict:
    """The row of a job that ended without rank 0's result: a time-out when a task's log has
    submitit's time-out line (rank 0's own log often does not: another task got the signal),
    a batch script that failed before any task started (a [slurm] setup line), else the ranks
    that ended without a result are named."""
    state = _state(job, mode="cache")
    logs = [_task_log(job, i) for i in range(job.num_tasks)]
    timed = [i for i, log in enumerate(logs) if "Job has timed out" in log]
    if timed:
        return failure_row(cell, f"the job reached its time limit ({_limit(cell, ctx)}): "
                           f"submitit's time-out signal ended rank(s) "
                           f"{', '.join(map(str, timed))}; job {job.job_id} ended {state} "
                           "without a result", ctx, "timeout", job_id=str(job.job_id))
    who = (f"rank(s) {', '.join(map(str, silent))} ended without a result (killed or crashed)"
           if silent else "no rank left a result")
    last = f"job {job.job_id} ended {state} without a result"
    if state == "CANCELLED":  # scancel (the user's, or an administrator's): not a crash
        who, last = "no rank left a result", (f"job {job.job_id} was cancelled (scancel) before "
                                              "it had a result")
    script = [line.split(BATCH_SCRIPT, 1)[1] for line in logs[0].splitlines()
              if BATCH_SCRIPT in line]
    if script and not any(TASK_STARTED in log for log in logs):  # it ended before srun: the
        # rows said "ranks killed or crashed", the console only "ended FAILED" (a SLURM audit)
        who = "no task started"
        last = (f"batch script {script[-1]} (job {job.job_id} ended {state} before its tasks "
                "started; the [slurm] setup lines run in that script)")
    return failure_row(cell, f"{who}; {type(e).__name__}: {e}\n{last}", ctx,
                       job_id=str(job.job_id))


BATCH_SCRIPT = "slurm_script: "
"""What bash's errors in a SLURM batch script start with (the script's name on the node)."""
TASK_STARTED = "Starting with JobEnvironment"
"""submitit's first log line in a task that started."""
REQUEUED = "Requeued job "
"""submitit's words (rank 0's log) once it has requeued a preempted job."""
TIMED_OUT = "Job not requeued because: timed-out"
"""submitit's words when its warning signal ends a job that cannot be requeued."""
SLURM_SIGNAL_DELAY_S = 90
"""How long before a SLURM job's limit submitit asks for its warning signal (its default)."""


def _limit(cell: Cell, ctx: RunContext) -> str:
    """The time limit a job reached, as the user sets it (a SLURM job's limit is its own)."""
    return ("the spec's [slurm] time_min or --time" if ctx.executor == "slurm" else
            f"timeout_min={cell.timeout_min}")


LOCAL_GRACE_S = 15.0
# submitit's LocalExecutor sends its time-out signal this long before its limit (its default,
# submitit/local/local.py; AutoExecutor does not expose it): a cell's job gets its limit plus
# this, or a 60 s spec was cut at 30 s (and the same cell ran to the end inline)
SUBMITIT_SIGNAL_DELAY_S = 30


def local_timeout_min(cell: Cell) -> int:
    """submitit's limit for a local job, in the whole minutes it takes, such that its time-out
    signal comes no earlier than the spec's ``timeout_min``."""
    return max(1, math.ceil((cell.timeout_min * 60 + SUBMITIT_SIGNAL_DELAY_S) / 60))


def local_limit_s(cell: Cell) -> float:
    """How long the driver waits for a local job: submitit's limit and a grace for its signal
    to end the job first."""
    return local_timeout_min(cell) * 60 + LOCAL_GRACE_S


STARTED = "cell-started"
"""A local job's rank 0 writes the wall time at which it starts measuring its cell here, in the
job's folder: the driver times the cell from then, to ``timeout_min`` as inline does (submitit's
own limit is whole minutes, up to a minute more; an audit saw a 1.2 s limit run 8 s to ok)."""


def _started_over(job, cell: Cell) -> bool:
    """Whether a local job's cell has run past ``timeout_min`` since its rank 0 began it."""
    try:
        started = float((Path(job.paths.folder) / STARTED).read_text())
    except (OSError, ValueError):  # not started yet (or a marker being written)
        return False
    return time.time() - started > cell.timeout_min * 60


def _time_out(job, cell: Cell, run: Run, ctx: RunContext) -> None:
    """Cancel a job past its limit; its cell is a ``timeout`` row."""
    job.cancel(check=False)
    if _started_over(job, cell):
        why = (f"the cell exceeded its time limit of {_seconds(cell.timeout_min * 60)} s "
               f"(timeout_min={cell.timeout_min}) from its start without a result and its job "
               "was cancelled")
    else:
        why = (f"the job exceeded its time limit of {local_limit_s(cell):.0f} s (timeout_min="
               f"{cell.timeout_min}, in whole minutes after submitit's "
               f"{SUBMITIT_SIGNAL_DELAY_S} s warning, plus {LOCAL_GRACE_S:.0f} s grace) without "
               "a result and was cancelled")
    append_row(run.rows, _ran_on(failure_row(cell, why, ctx, "timeout",
                                             job_id=str(job.job_id)), job, ctx))
    append_row(run.dir / "jobs.jsonl", {"cell_id": cell.cell_id, "job_id": str(job.job_id),
                                        "collected": True})
    _forget_local_tasks(job)


UNKNOWN_LIMIT_S = 600.0
"""How long a SLURM job may stay unknown to accounting before the driver stops waiting."""


SBATCH_SLOW_S = 10.0
"""How long sbatch may take before the driver says that it waits on it (signals held)."""
QUEUE_REPORT_S = 60.0
"""How often the driver asks squeue why its SLURM jobs wait; a line when the answer changes."""


def _queue_line(jobs) -> str | None:
    """What squeue says of these SLURM jobs, in one line ("3 running, 2 pending (Resources)");
    a held job is named, with how to release it (the driver waits on it for ever). None when
    squeue does not answer or lists none of them (finished, or not yet known)."""
    import collections
    import subprocess

    ids = {str(j.job_id) for j in jobs}
    arrays = sorted({i.split("_")[0] for i in ids})
    try:  # -r: one line per array task
        out = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i|%T|%r"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    seen = collections.defaultdict(list)
    for line in out.splitlines():
        job_id, state, reason = (line.strip().split("|") + ["", ""])[:3]
        if job_id in ids:
            seen[state.lower(), "" if reason == "None" else reason].append(job_id)
    parts = []
    for (state, reason), these in sorted(seen.items()):
        part = f"{len(these)} {state}" + (f" ({reason})" if reason else "")
        if "held" in reason.lower():
            more = f" and {len(these) - 5} more" if len(these) > 5 else ""
            part += f": {', '.join(sorted(these)[:5])}{more} (scontrol release <id> lets it run)"
        parts.append(part)
    return ", ".join(parts) or None


def _wait(pending: dict, run: Run, ctx: RunContext, poll_s: float,
          deadline: float | None = None) -> None:
    """Collect each job as it gets an outcome. ``deadline`` (time.monotonic(); local jobs): a
    job still without one then is cancelled and its cell is a ``timeout`` row (submitit's own
    limit ends a job that heeds its warning signal, but one stuck deaf to it ran on and ended
    as an ``error``). SLURM jobs have no deadline, but one that accounting does not report for
    ``UNKNOWN_LIMIT_S`` (purged, another cluster, slurmdbd down) ends the wait with an error
    that says how to go on: submitit waits on such a job for ever."""
    unknown_since: dict = {}
    said, asked = None, -math.inf
    while pending:
        for job in [j for j in pending if _ready(j)]:
            if _collect(job, pending[job], run, ctx):
                del pending[job]
        if pending and deadline is not None and (time.monotonic() > deadline or any(
                _started_over(job, cell) for job, cell in pending.items())):
            for job, cell in pending.items():
                _time_out(job, cell, run, ctx)
            return
        if pending and deadline is None:
            now = time.monotonic()
            if now - asked >= QUEUE_REPORT_S:  # hours in a queue, or a held job: not in silence
                line, asked = _queue_line(pending), time.monotonic()  # (after: squeue may hang)
                if line and line != said:
                    said = line
                    print(f"slurm: {line}", flush=True)
            for job in pending:
                if _state(job) == "UNKNOWN":
                    unknown_since.setdefault(job, now)
                else:
                    unknown_since.pop(job, None)
            lost = sorted(str(j.job_id) for j, t in unknown_since.items()
                          if j in pending and now - t > UNKNOWN_LIMIT_S)
            if lost:
                raise ValueError(
                    f"SLURM accounting has not reported job(s) {', '.join(lost)} for "
                    f"{UNKNOWN_LIMIT_S / 60:.0f} min (sacct fails or slurmdbd is down, the job "
                    "was purged, or SLURM_CONF names another cluster); their cells have no "
                    "row. Run the same command again once `sacct -j <id>` reports them, or "
                    f"delete their lines from {run.dir / 'jobs.jsonl'} to run those cells "
                    "again")
        if pending:
            time.sleep(poll_s)


# Every submitted job is written down (<run>/jobs.jsonl) before the driver waits on it: a driver
# that dies (ssh drop, killed login-node process) leaves jobs that run on, or have finished with
# their rows in submitit's result files; the next driver collects or waits for them instead of
# running those cells again.


def _record_jobs(run: Run, kind: str, folder: Path, pairs) -> None:
    for cell, job in pairs:
        proc = getattr(job, "_process", None)  # a local job's process: alive after the driver
        append_row(run.dir / "jobs.jsonl", {
            "cell_id": cell.cell_id, "job_id": str(job.job_id), "kind": kind,
            "folder": str(folder), "tasks": job.num_tasks, "submitted": time.time(),
            "pid": proc.pid if proc is not None else None})


def pending_jobs(run_dir: Path, kind: str) -> dict[str, dict]:
    """{cell id: job record} of the cells whose last logged job (of this executor kind) was
    submitted but not collected (a job whose row of that cell is in rows.jsonl counts as
    collected; another cell's row with the same job id does not: local job ids are pids, which
    wrap, and SLURM's restart after a state reset, so a live job was taken for collected and its
    cell run twice)."""
    rows = {(r.get("cell_id"), r.get("job_id")) for r in read_rows(run_dir / "rows.jsonl")}
    last = {r["cell_id"]: r for r in read_rows(run_dir / "jobs.jsonl", keys=("cell_id",))}
    return {c: r for c, r in last.items()
            if not r.get("collected") and r.get("kind") == kind
            and (c, r["job_id"]) not in rows}


def local_job_alive(pid: int | None, folder: str | Path | None = None) -> bool:
    """The recorded process still runs and is still submitit's (not a reused pid): with
    ``folder`` (the job's, as submitted: each local submission has its own), the controller
    of that very job, not another run's that took the pid after it ended."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"submitit" in cmdline and (folder is None or os.fsencode(str(folder)) in cmdline)


def local_job_held(rec: dict) -> bool:
    """A local job of ``pending_jobs`` that only the local executor may collect: its process
    still runs, or it ended with an outcome (a row or an error) that no driver has read."""
    if local_job_alive(rec.get("pid"), rec.get("folder")):
        return True
    if not rec.get("folder"):  # nothing to read an outcome from
        return False
    return _has_outcome(_recorded_job(rec, "local"))


def _recorded_job(rec: dict, kind: str):
    """The submitit job of a ``jobs.jsonl`` record, to read its state and results."""
    import submitit

    job_cls = submitit.SlurmJob if kind == "slurm" else submitit.LocalJob
    return job_cls(folder=rec["folder"], job_id=rec["job_id"], tasks=range(rec["tasks"]))


def _adopt(cells: list[Cell], run: Run, kind: str, ctx: RunContext, poll_s: float):
    """Cells whose job an earlier driver submitted: a job with an outcome gets its row now, a
    SLURM job still queued or running is returned to wait for, a local job whose process still
    runs is waited for here; the cells left (no job, or a job that left nothing) are returned
    to submit."""
    uncollected = pending_jobs(run.dir, kind)
    pending, left = {}, []
    for cell in cells:
        rec = uncollected.get(cell.cell_id)
        if rec is None:
            left.append(cell)
            continue
        job = _recorded_job(rec, kind)
        if kind == "slurm":
            if not (_ready(job) and _collect(job, cell, run, ctx)):
                pending[job] = cell
            continue
        # wait no longer than the limit the submitting driver would have enforced
        deadline = rec.get("submitted", 0) + local_limit_s(cell)
        pid = rec.get("pid")
        alive = functools.partial(local_job_alive, pid, rec.get("folder"))
        while (alive() and not _has_outcome(job) and time.time() < deadline
               and not _vanished_local_tasks(job) and not _started_over(job, cell)):
            time.sleep(poll_s)
        if _has_outcome(job) or _vanished_local_tasks(job):
            _collect(job, cell, run, ctx)
        elif alive():  # running past its limit: a timeout, as it would have been
            _time_out(job, cell, run, ctx)
        else:  # it died without a result (with the driver, say): run the cell again
            left.append(cell)
        if alive():  # ranks left waiting on a failed one, or past the limit:
            os.kill(pid, signal.SIGINT)  # stop them (submitit's LocalJob.cancel) before timing
    if pending:
        print(f"waiting for {len(pending)} job(s) an earlier driver submitted", flush=True)
    return pending, left


def _has_outcome(job) -> bool:
    got = _current_outcomes(job)
    return 0 in got or any(o == "error" for o, _ in got.values())


def _current_outcomes(job) -> dict[int, tuple[str, object]]:
    """``_outcomes`` less the errors of a SLURM job's earlier attempts, whose files are set
    aside (renamed ``*.attempt-<n>``, kept): a preempted job's rank 0 requeues it and exits
    without a result, and its peers, losing their connection to it, write errors that are not
    the cell's outcome; taken for it, the cell was an error row and the driver cancelled the
    requeued job (a SLURM audit). An error names its attempt (``cell_job``); the current one is
    the latest that an error names or SLURM's restart count, from the controller, or where it
    does not answer, from rank 0's log. No clock is compared (the file server's, the nodes' and
    the driver's may differ)."""
    import submitit
    from submitit.core.utils import pickle_load

    got = _outcomes(job)
    tags = {i: split_attempt(value)[0] for i, (outcome, value) in got.items()
            if outcome == "error"}
    if not isinstance(job, submitit.SlurmJob) or not any(t is not None for t in tags.values()):
        return got
    restarts = _restarts(job)
    current = max([t for t in tags.values() if t is not None]
                  + [_logged_restarts(job) if restarts is None else restarts])
    out = dict(got)
    for i, tag in tags.items():
        if tag is None or tag >= current:
            continue
        path = job.task(i).paths.result_pickle
        with contextlib.suppress(EOFError, OSError):  # read again: the file may be the next
            if split_attempt(pickle_load(path)[1])[0] == tag:  # attempt's by now
                path.rename(path.with_name(f"{path.name}.attempt-{tag}"))
        del out[i]  # (a file that would not move is still not the outcome)
    return out


def split_attempt(error) -> tuple[int | None, str]:
    """(the attempt a task's error names, its text without the tag); (None, text): no tag, an
    error outside ``cell_job`` or off SLURM. Both forms: a note, and Python 3.10's chained
    ``SlurmAttempt``."""
    text = str(error)
    found = re.search(rf"^(?:(?:\S+\.)?{SlurmAttempt.__name__}: )?{ATTEMPT_NOTE}(\d+) .*\s*\Z",
                      text, re.MULTILINE)
    if not found:
        return None, text
    head = text[:found.start()]
    if found.group(0).startswith(ATTEMPT_NOTE):  # a note
        return int(found.group(1)), head
    cause = head.rfind("\nThe above exception was the direct cause of the following exception:")
    return int(found.group(1)), head[:cause] if cause >= 0 else head


def _logged_restarts(job) -> int:
    """How often rank 0's log says submitit requeued the job ("Requeued job", logged once
    scontrol has put it back; SLURM appends each attempt's log to the same file). 0 where
    submitit's info lines are off (SUBMITIT_LOG_LEVEL)."""
    return _task_log(job, 0).count(REQUEUED)  # (an info line: on stdout only)


def _restarts(job) -> int | None:
    """How often SLURM has requeued a job, from its controller; None when it does not answer
    or the job has left its memory. Not sacct: its ``-D`` also lists older jobs of the same id,
    after SLURM's state was reset, and it records a requeued attempt late."""
    import subprocess

    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job.job_id)],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\bRestarts=(\d+)", out)
    return int(found.group(1)) if found else None


def job_base(job_folder, sweep: str, run_id: str) -> Path:
    """A run's folder under a shared ``--job-folder``: job ids start again at 1 when SLURM's
    state is reset, and an old job's result file must not pass for a new job's."""
    return Path(job_folder) / f"{sweep}-{run_id}"


def submit_cells(cells: list[Cell], *, kind: str, run: Run, ctx: RunContext,
                 slurm: SlurmSpec | None = None, folder: Path | None = None,
                 poll_s: float = 1.0, on_submit: Callable | None = None) -> None:
    """Run cells through submitit (``kind`` = "local" or "slurm"); append one row per cell.

    SLURM: the cells of one scale are one job array, every scale's submitted before the driver
    collects results as they complete. Local: one job at a time. ``folder`` holds submitit's
    pickles and logs (default <run>/jobs; on a cluster it must be on a shared filesystem).
    ``on_submit(jobs)`` sees the submitted jobs (tests use it to interrupt one).
    """
    if kind not in ("local", "slurm"):
        raise ValueError(f"submit_cells runs kind 'local' or 'slurm', not {kind!r}")
    from submitit.core.utils import FailedJobError

    slurm = slurm or SlurmSpec()
    # absolute: jobs.jsonl must find the folder from wherever the run is resumed
    base = (job_base(folder, run.dir.parent.name, run.dir.name) if folder
            else run.dir / "jobs").absolute()
    done = run.done()
    adopted, left = _adopt([c for c in cells if c.cell_id not in done], run, kind, ctx, poll_s)
    _wait(adopted, run, ctx, poll_s)
    submitted: dict = {}  # SLURM: every scale's array queued at once, then waited for (one
    # after another, each scale paid its own queue wait: a SLURM audit)
    for group in _group_by_scale(left):
        if kind == "local":
            if group[0].device == "cuda":  # one machine: its GPUs must be enough
                group = _skip_if_too_few_gpus(group, run, ctx, "local")
            for cell in group:  # a folder per submission: an old PID's results are not ours
                mine = base / f"local-{uuid.uuid4().hex[:12]}" / "%j"
                # a job started is written down, even on Ctrl-C. And it gets SIGINT's default
                # action, which submitit's cancel sends: held here by a Python handler, which
                # the child's exec resets, not SIG_IGN, which it inherits from a driver started
                # by a script (`cmd &`), so a cancelled job's ranks (one waiting on a failed
                # peer, one past its limit) ran on until the process group's timeout
                with held_signals():
                    job = _executor(kind, mine, [cell], slurm, cell.sweep).submit(
                        cell_job, cell.to_json(), ctx)
                    _record_jobs(run, kind, mine, [(cell, job)])
                if on_submit:
                    on_submit([job])
                _wait({job: cell}, run, ctx, poll_s,
                      deadline=time.monotonic() + local_limit_s(cell))
            continue
        # a folder per submission: SLURM's job ids start again after its state is reset, and
        # an old attempt's result file must not pass for a retried cell's (local: PIDs)
        folder = base / f"slurm-{uuid.uuid4().hex[:12]}" / "%j"
        ex = _executor(kind, folder, group, slurm, group[0].sweep)
        # Ctrl-C between sbatch and the record left jobs that no driver knew of (a resume
        # submitted their cells again: a SLURM audit), and one during sbatch killed it after
        # it had queued the array (a review): signals are blocked, sbatch's too, meanwhile
        said = io.StringIO()
        with held_signals(block=True):
            # a Ctrl-C held while sbatch waits on an unreachable controller went unexplained
            slow = threading.Timer(SBATCH_SLOW_S, print, [
                f"sbatch has not answered in {SBATCH_SLOW_S:g} s (is the SLURM controller "
                "reachable?); a Ctrl-C takes effect once it answers and its jobs, if any, are "
                "written down"], {"flush": True})
            slow.start()
            try:  # (a driver in a requeued batch job: sbatch would pass on its restart count)
                with contextlib.redirect_stderr(said), _unset("SLURM_RESTART_COUNT"):
                    jobs = ex.map_array(cell_job, [c.to_json() for c in group],
                                        [ctx] * len(group))
            except FailedJobError as e:  # no controller, a bad partition or account: say so
                said = io.StringIO()  # what submitit printed is sbatch's words: said once, here
                why = str(e).strip() or (f"sbatch ended with status "
                                         f"{getattr(e.__cause__, 'returncode', '?')}, silent")
                raise ValueError(f"SLURM refused the job array: {why}") from None
            finally:  # anything else submitit printed
                slow.cancel()
                print(said.getvalue(), end="", file=sys.stderr)
            _record_jobs(run, kind, folder, zip(group, jobs, strict=True))
        c = group[0]
        print(f"submitted job array {str(jobs[0].job_id).split('_')[0]}: {len(group)} cell(s), "
              f"{c.nodes} node(s) x {c.ranks_per_node} task(s) each", flush=True)
        if on_submit:
            on_submit(jobs)
        submitted.update(zip(jobs, group, strict=True))
    _wait(submitted, run, ctx, poll_s)


@contextlib.contextmanager
def _unset(name: str):
    """The environment variable ``name`` unset inside (for the processes started there)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


# ---------------------------------------------------------------------------------------------
# dry-run


def dry_run(cells: list[Cell], *, slurm: SlurmSpec, sweep: str, folder: str = "<run>/jobs",
            stream=None, predicted: dict[str, str] | None = None) -> float:
    """Print the sbatch script of each job array and the GPU-hours reserved; return them.

    ``predicted``: a line per cell id (the simulator's time and memory on a hardware profile,
    ``suites.run``), printed after the cell's."""
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem, _make_sbatch_string

    stream = stream or sys.stdout
    eq = SlurmExecutor._equivalence_dict()
    total = 0.0
    groups = _group_by_scale(cells)
    for i, group in enumerate(groups):
        params = slurm_parameters(group, slurm, sweep=sweep)
        native = {eq.get(k, k): v for k, v in params.items() if not k.startswith("slurm_")}
        native.update({k[len("slurm_"):]: v for k, v in params.items() if k.startswith("slurm_")})
        if "mem" in native:
            native["mem"] = _convert_mem(native["mem"])
        command = f"{sys.executable} -u -m submitit.core._submit {folder}/slurm-<id>/%j"
        script = _make_sbatch_string(command=command, folder=f"{folder}/slurm-<id>/%j",
                                     map_count=len(group) if len(group) > 1 else None, **native)
        c = group[0]
        gpus = c.world if c.device == "cuda" else 0
        hours = len(group) * gpus * slurm.time_min / 60
        total += hours
        print(f"# job array {i + 1}/{len(groups)}: {len(group)} cells, {c.nodes} node(s) x "
              f"{c.ranks_per_node} task(s), {c.device}; at most {hours:.1f} GPU-hours "
              f"({len(group)} x {gpus} GPUs x {slurm.time_min} min)", file=stream)
        for cell in group:
            print(f"#   [{cell.cell_id}] {cell.describe()}", file=stream)
            if predicted and cell.cell_id in predicted:
                print(f"#       {predicted[cell.cell_id]}", file=stream)
        print(script, file=stream)
    print(f"# total: {len(cells)} cells in {len(groups)} job array(s), at most {total:.1f} "
          "GPU-hours (time limit x GPUs; nothing was submitted)", file=stream)
    return total
