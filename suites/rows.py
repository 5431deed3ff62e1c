"""Result rows: a measured cell, or a failed one, as a ``results.schema`` row with provenance.

Failures are rows, never gaps (STYLE principle 8): ``failure_row`` records the status and the
error text of a cell that raised, ran out of memory, timed out or lost a rank, and the sweep goes
on. ``classify`` turns an error text (a traceback, a spawn or submitit error) into a status.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from results.schema import COLUMNS, empty_row
from suites.cells import Cell
from suites.provenance import host_provenance, method_source, no_host, now_iso

__all__ = ["REPORT", "RunContext", "classify", "clip_error", "failure_row", "make_row"]

ERROR_CHARS = 4000  # an error row keeps about this much (clip_error: the cause kept)


@dataclass(frozen=True)
class RunContext:
    """What every row of one sweep run shares; travels to ranks and jobs (picklable)."""

    run_id: str
    executor: str
    sweep_spec: str
    """JSON of the whole sweep spec."""
    git_commit: str | None
    git_dirty: bool | None
    data_dir: str | None = None
    """Where the run writes (its ``--out``): data, not code, for the dirty flag of a job."""


_OOM = ("OutOfMemoryError", "CUDA out of memory", "out of memory", "can't allocate memory",
        "DefaultCPUAllocator: not enough memory", "std::bad_alloc", "MemoryError",
        "OUT_OF_MEMORY")  # the last: SLURM's state for a job its memory limit killed
# matched in any case: gloo says "Timed out waiting ...ms for recv", its store "wait timeout",
# NCCL's watchdog "collective operation timeout"; SLURM's state "TIMEOUT" as written (a bare
# "timeout" is in every traceback through comm.init's timeout_s)
_TIMEOUT = ("timed-out", "timed out", "wait timeout", "operation timeout",
            "did not finish within", "exceeded its time limit")


def classify(error_text: str) -> str:
    """oom | timeout | error, from the text of a failure."""
    if any(s in error_text for s in _OOM):
        return "oom"
    lowered = error_text.lower()
    if "TIMEOUT" in error_text or any(s in lowered for s in _TIMEOUT):
        return "timeout"
    return "error"


def _cell_columns(cell: Cell) -> dict:
    return {
        "sweep": cell.sweep, "cell_id": cell.cell_id, "source": "measured",
        "workload": cell.workload, "method": cell.method, "label": cell.label,
        "method_options": json.dumps(cell.options, sort_keys=True), "model": cell.model,
        "checkpointing": cell.checkpointing, "fused_head": cell.fused_head,
        "seq_len": cell.seq_len, "batch": cell.batch, "heads": cell.heads,
        "kv_heads": cell.kv_heads, "head_dim": cell.head_dim, "causal": cell.causal,
        "window": json.dumps(list(cell.window)) if cell.window else None, "dtype": cell.dtype,
        "world": cell.world, "nodes": cell.nodes, "ranks_per_node": cell.ranks_per_node,
        "device": cell.device, "warmup": cell.warmup, "repeats": cell.repeats,
        "spec": cell.to_json(), "device_count": cell.world,
    }


def make_row(cell: Cell, metrics: dict, ctx: RunContext, *, host: dict | None = None) -> dict:
    """A complete row: the cell, its metrics (``suites.measure``), provenance."""
    row = empty_row()
    row.update(_cell_columns(cell))
    row.update({k: v for k, v in metrics.items() if k in COLUMNS})
    row.update(host if host is not None else host_provenance(cell.device))
    row.update(run_id=ctx.run_id, executor=ctx.executor, sweep_spec=ctx.sweep_spec,
               git_commit=ctx.git_commit, git_dirty=ctx.git_dirty,
               method_source=method_source(cell.method), date=now_iso())
    if row["error"]:
        row["error"] = clip_error(str(row["error"]))
    return row


REPORT = re.compile(r"^rank \d+ (raised:|exited without a result)", re.MULTILINE)
"""Where a rank's report starts in an error (``burst.spawn``, the executors: the cause first)."""


def clip_error(text: str, limit: int = ERROR_CHARS) -> str:
    """``text`` in at most about ``limit`` characters, its cause kept: the end of a traceback
    (where its exception is) and, where ranks reported (``burst.spawn`` and the executors list
    the rank that failed first first, its peers' closed connections after it), the end of the
    first report with its header, then the end of the others with the second's header."""
    if len(text) <= limit:
        return text
    starts = [m.start() for m in REPORT.finditer(text)]
    if not starts:
        return _tail(text, limit)
    # what comes before the reports (an executor's "rank(s) 1 ended without a result (killed
    # or crashed); then:"): the cause, kept whole (an audit saw it cut with the report's head)
    lead = text[:starts[0]][:limit // 4]
    if len(starts) == 1:
        return lead + _with_header(text[starts[0]:], limit - len(lead))
    first, rest = text[starts[0]:starts[1]], text[starts[1]:]
    first = lead + _with_header(first, limit // 2 - len(lead))
    return first + _with_header(rest, limit - len(first))


def _with_header(report: str, limit: int) -> str:
    """A report's first line (its "rank N raised:") and the end of the rest."""
    if len(report) <= limit:
        return report
    header, _, body = report.partition("\n")
    return header + "\n" + _tail(body, max(limit - len(header) - 1, 200))


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    mark = f"[... {len(text) - limit} characters cut ...]\n"
    return mark + text[-(limit - len(mark)):]


def failure_row(cell: Cell, error_text: str, ctx: RunContext, status: str | None = None,
                *, job_id: str | None = None) -> dict:
    """The row of a cell that produced no measurement. With ``job_id`` it is written by the
    driver for a job that ran elsewhere: the host columns stay empty, not the driver's (the
    executor fills in the job's node)."""
    status = status or classify(error_text)
    host = None if job_id is None else no_host() | {"job_id": job_id}
    return make_row(cell, {"status": status, "error": error_text}, ctx, host=host)
