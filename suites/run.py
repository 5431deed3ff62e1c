"""The sweep driver: pick the run folder, skip what is done, dispatch, report, consolidate.

    run_sweep("smoke")                          # suites/specs/smoke.toml, inline executor
    run_sweep(spec, executor="slurm", slurm=SlurmSpec(partition="gpu"))

Run folder (``results/<sweep>/<run_id>/``): ``run_id`` names one; otherwise the latest run of
the sweep is resumed when it measures the same cells (so a killed sweep picks up where it
stopped, re-running a finished one only prints its table, and a spec changed only in its time
limit, [slurm] table, description or baseline resumes its run); ``new`` starts a fresh run
(``make demo`` does, so it always measures). Jobs that a dead driver submitted through submitit
are collected or waited for, not run again (``suites.executors``). Cells with a row are skipped
(``retry_failed`` re-runs oom/timeout/error and skipped cells; the consolidated table keeps the
last row per cell). One driver per run folder (``results.store.RunLock``).

Progress: a tqdm bar over cells (with ETA) when stdout is a terminal, one log line per cell
otherwise; both follow rows.jsonl, whoever writes it (ranks, the driver).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from results import store
from results.schema import FAILED
from results.tables import METRICS, render, summary
from suites.cells import Cell, cell_problem, expand
from suites.executors import (
    EXECUTORS,
    Run,
    dry_run,
    job_base,
    local_job_held,
    pending_jobs,
    run_inline,
    submit_cells,
)
from suites.provenance import code_provenance, method_source
from suites.rows import REPORT, RunContext, failure_row
from suites.spec import SlurmSpec, SweepSpec, is_folder_name, load_spec

__all__ = ["RunResult", "run_sweep", "select_run", "summary_text"]

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results"


@dataclass
class RunResult:
    run_dir: Path | None
    table: object  # pandas DataFrame (None for dry-run)
    ran: int
    """Cells run by this call (not skipped as already done)."""


def _spec_hash(spec: SweepSpec) -> str:
    """What a run measures: its sweep's name and cells (their ids leave out the time limit). A
    spec changed only in where or how long it runs (timeout, [slurm], description, baseline)
    resumes the same run, so raising a time limit and --retry-failed re-runs the failed cells
    only."""
    ids = sorted(c.cell_id for c in expand(spec))
    return hashlib.sha256(json.dumps([spec.name, ids]).encode()).hexdigest()[:16]


def _same_spec(meta: dict, spec: SweepSpec, *, empty: bool = True) -> bool:
    """The run's meta is of this spec: same cells (``_spec_hash``), or (runs recorded under an
    older hash) the very same cell ids in its list of cells; the same spec JSON is not enough
    (a code change that renames the cells would measure every one again into the old run);
    ``empty``: a run without meta counts as this spec's."""
    if not meta.get("spec_hash"):
        return empty
    return (meta["spec_hash"] == _spec_hash(spec)
            or set(meta.get("cells") or ()) == {c.cell_id for c in expand(spec)})


def select_run(spec: SweepSpec, out: Path, run_id: str | None = None, new: bool = False) -> Path:
    """The run folder to write: the named one, else the latest run of this very spec (same
    ``_spec_hash``; it is resumed, its done cells skipped), else a new one. ``new``: always a new
    one (a fresh measurement of a finished sweep)."""
    sweep_dir = Path(out) / spec.name
    if run_id:
        if not is_folder_name(run_id):
            raise ValueError(f"--run-id {run_id!r}: a run id is one folder under "
                             f"{sweep_dir} (letters, digits, _ . -, not starting with . or -)")
        named = sweep_dir / run_id
        if new and named.exists():
            raise ValueError(f"--new with --run-id {run_id!r}: {named} exists; name a new run "
                             "id, or drop --new to resume it")
        if named.exists() and not _same_spec(store.read_meta(named), spec):
            raise ValueError(f"run {named} holds another spec's cells (a changed method, "
                             "length, warmup, repeats, seed, ...): its rows would mix; drop "
                             "--run-id (this spec's own run is then resumed or started) or "
                             "name a new run id")
        if named.exists() and not store.read_meta(named).get("spec_hash"):
            # no record of its spec: its rows must be of this spec's cells
            foreign = ({r.get("cell_id") for r in store.read_rows(named / store.ROWS)}
                       - {c.cell_id for c in expand(spec)})
            if foreign:
                raise ValueError(f"run {named} has no run.json, and rows of {len(foreign)} "
                                 "cells that are not this spec's: they would mix into its "
                                 "table; name a new run id")
        return named
    if not new and sweep_dir.exists():  # newest first: a later run of another spec is passed
        for run in reversed(store.runs_by_time(sweep_dir)):
            if _same_spec(store.read_meta(run), spec, empty=False):
                return run
    rid = store.new_run_id()
    fresh, n = sweep_dir / rid, 2
    while fresh.exists():  # two new runs within a second of one process
        fresh, n = sweep_dir / f"{rid}.{n}", n + 1
    return fresh


class _Progress:
    """Follows rows.jsonl in a thread; a tqdm bar on a terminal, log lines otherwise."""

    def __init__(self, rows: Path, cells: list[Cell], done: int, stream):
        self.rows, self.stream, self.total = rows, stream, len(cells)
        self.count = done
        self.by_id = {c.cell_id: c for c in cells}
        self.offset = rows.stat().st_size if rows.exists() else 0
        self.bar = None
        if getattr(stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=done, unit="cell", file=stream,
                            dynamic_ncols=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._poll()
        if self.bar is not None:
            self.bar.close()
        return False

    def _loop(self):
        while not self._stop.wait(0.5):
            self._poll()

    def _poll(self):
        import json

        try:  # progress is best-effort: the run's own writes report a lost rows file
            with open(self.rows, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not there yet, or gone (a disk lost, a folder in its place)
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
                continue
            self._report(row)

    def _report(self, row: dict):
        if row.get("cell_id") not in self.by_id:
            return
        self.count += 1
        t = row.get("time_s")
        what = f"{row['status']}" + (f" {t * 1e3:.1f} ms" if t else "")
        if row["status"] != "ok" and row.get("error"):
            what += f" ({short_reason(row['error'])})"
        desc = self.by_id[row["cell_id"]].describe()
        if self.bar is not None:
            self.bar.set_postfix_str(f"{desc}: {what}"[:80])
            self.bar.update(1)
        else:
            print(f"[{self.count}/{self.total}] {desc}: {what}", file=self.stream, flush=True)


def short_reason(error, limit: int = 120) -> str:
    """The last line of a row's error for a progress line, of its first rank's report where the
    ranks reported (``burst.spawn`` lists the cause first: a rank's error, not the "connection
    closed" of the ranks it left waiting): cut at a word and ended with "..." past ``limit``
    characters (cut mid-list, "valid degrees: 1, 2," read as the whole list)."""
    lines = str(error).strip().splitlines()
    starts = [i for i, line in enumerate(lines) if REPORT.match(line)]
    if len(starts) > 1:  # the first report (one line when it is all on its first)
        lines = lines[starts[0]:starts[1]]
        lines = [line for line in lines if line.strip()] or lines
    # a C++ backtrace after torch's message ("Exception raised from ...", "frame #0: ...") and
    # lines without a word (a lone quote) say nothing of why
    cut = next((i for i, line in enumerate(lines) if line.startswith("Exception raised from ")),
               len(lines))
    why = ([line for line in lines[:cut] if re.search(r"\w", line)] or lines)[-1]
    return why if len(why) <= limit else why[:limit - 4].rsplit(" ", 1)[0] + " ..."


def _check_out(sweep: Path) -> None:
    """Refuse, before anything runs, a sweep folder that cannot be made (``--out`` a file, or
    under one, or where this user cannot write): the OSError came later and read as a run that
    died with its rows kept. The sweep's own lock tries it (and removes the folders it made
    for nothing, as when a run is refused)."""
    try:
        with store.SweepLock(sweep):
            pass
    except OSError as e:
        raise ValueError(f"--out: cannot write the sweep folder {sweep} "
                         f"({e.strerror or e}); nothing ran") from None


def run_sweep(spec: SweepSpec | str | Path, *, executor: str = "inline",
              out: str | Path = DEFAULT_OUT, run_id: str | None = None, new: bool = False,
              retry_failed: bool = False, slurm: SlurmSpec | None = None,
              job_folder: str | Path | None = None, stream=None,
              on_submit=None, hardware: str | None = None) -> RunResult:
    """Run (or resume) a sweep; return its run folder and consolidated table.

    ``slurm`` replaces the spec's [slurm] table (the CLI merges its flags into it first).
    ``hardware`` (dry-run only): a profile of ``suites/hardware`` on which the simulator
    predicts each GPU cell's time and memory, printed with the cell.
    """
    stream = stream or sys.stdout
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    slurm = slurm or spec.slurm
    if hardware is not None and executor != "dry-run":
        raise ValueError(f"a hardware profile ({hardware!r}) prices a dry run's cells; the "
                         f"{executor} executor measures them (burst-bench simulate predicts a "
                         "whole sweep's rows)")
    cells = expand(spec)
    _check_out(Path(out) / spec.name)
    if executor == "dry-run":
        _dry_run_sweep(spec, cells, out=out, run_id=run_id, new=new, retry_failed=retry_failed,
                       slurm=slurm, job_folder=job_folder, stream=stream, hardware=hardware)
        return RunResult(None, None, 0)

    # one driver at a time chooses and claims a run of this sweep (two started together
    # each began a run of their own)
    with store.SweepLock(Path(out) / spec.name) as choosing:
        run = Run(select_run(spec, Path(out), run_id, new))
        if not run.dir.exists() and not new and run_id is None:
            _note_unfinished_other(run.dir.parent, spec, stream, tuple(c.cell_id for c in cells))
        run.dir.mkdir(parents=True, exist_ok=True)
        with store.RunLock(run.dir):
            store.repair(run.rows)  # a row torn by a killed writer is dropped; its cell runs again
            store.repair(run.dir / "jobs.jsonl")  # and a torn job record (that job runs again)
            meta = store.read_meta(run.dir)
            _refuse_table_only(run.dir)
            ids = [c.cell_id for c in cells]
            skip = _done(store.read_rows(run.rows), retry_failed)
            todo = [c for c in cells if c.cell_id not in skip]
            _refuse_other_executors_jobs(run.dir, todo, executor)
            # a finished run is left as it is (a committed one stays clean), unless its baseline
            # changed: the table's speedups follow the spec's baseline
            if todo or not meta or meta.get("baseline") != spec.baseline:
                store.write_meta(run.dir, {
                    "sweep": spec.name, "run_id": run.dir.name, "source": spec.source,
                    "source_args": list(spec.source_args),
                    "spec": spec.to_json(), "spec_hash": _spec_hash(spec),
                    "baseline": spec.baseline,
                    "cells": list(dict.fromkeys([*meta.get("cells", []), *ids])),
                    "created": meta.get("created") or store.created_stamp(),
                    "executor": executor,
                })
            choosing.release()  # claimed: a driver started now finds this run, and its lock
            if todo:  # the table would lag the rows: a driver killed now leaves none, not a
                # stale one
                store.drop_tables(run.dir)
            queued = (len(_held_jobs(run.dir, executor, todo))
                      if executor in ("local", "slurm") else 0)  # a dead driver's jobs
            print(f"sweep {spec.name}: {len(cells)} cells, {len(cells) - len(todo)} already done, "
                  f"running {len(todo)} ({executor}"
                  + (f"; {queued} of them already submitted by an earlier driver, whose jobs "
                     "are collected, not run again" if queued else "")
                  + f") -> {run.dir}", file=stream, flush=True)
            _note_shared_cores(todo, executor, stream)
            # a retried cell keeps its old failure row (history); the table keeps the newest row
            run = Run(run.dir, start=run.rows.stat().st_size if run.rows.exists() else 0,
                      skip=frozenset(skip))
            data_dir = str(Path(out).resolve())  # an --out inside the checkout is data, not code
            ctx = RunContext(run_id=run.dir.name, executor=executor, sweep_spec=spec.to_json(),
                             data_dir=data_dir, **code_provenance(data_dir))
            if todo and skip:
                _warn_mixed_code(store.read_rows(run.rows), ctx, stream)
            if skip:
                _warn_changed_methods(store.read_rows(run.rows), skip, stream)
            if not todo and cells:  # a finished run (the committed one, on a fresh clone, say)
                rows = store.read_rows(run.rows)
                made = sorted({f"{_code(r.get('git_commit'), r.get('git_dirty'))} on "
                               f"{r.get('hostname') or 'unknown'}" for r in rows})
                print(f"nothing to run: every cell has a row in run {run.dir.name} (from "
                      f"{', '.join(made) or 'unknown code'}); the table below is that run's, and "
                      "--new measures every cell again", file=stream, flush=True)
            try:
                with _Progress(run.rows, cells, len(cells) - len(todo), stream):
                    todo = _skip_invalid(todo, run, ctx)
                    if todo and executor == "inline":
                        run_inline(todo, run, ctx)
                    elif todo:
                        submit_cells(todo, kind=executor, run=run, ctx=ctx, slurm=slurm,
                                     folder=job_folder, on_submit=on_submit)
            except KeyboardInterrupt as e:  # Ctrl-C: the table of what ran, and how to go on
                _report_interrupt(run, cells, ids, executor=executor, new=new, stream=stream)
                e.reported = True  # the CLI adds no second message
                raise
            except Exception:  # SLURM refused the array, a full disk, ...: the table of what ran
                with contextlib.suppress(Exception):
                    store.consolidate(run.dir)
                raise
            table = store.consolidate(run.dir)
    print(summary_text(table, spec), file=stream, flush=True)
    return RunResult(run.dir, table, len(todo))


def _predictions(cells: list[Cell], hardware: str, time_min: float) -> tuple[dict, list, int]:
    """The simulator's line for each GPU cell on ``hardware``, the ids of the cells it
    predicts out of memory, and the number of CPU cells (not priced). A cell is priced as this
    project's code runs it (no paper system: what a run measures,
    ``SweepSpec.as_this_engine``); its calls (``suites.measure.step_calls``) are compared with
    the time limit, the start-up (spawn, model build) and the error check's float64
    reference are not priced."""
    from suites.hardware import load
    from suites.measure import step_calls
    from suites.simulate import predict

    hw = load(hardware)
    lines, oom, host = {}, [], 0
    for c in cells:
        if c.device != "cuda":
            host += 1
            continue
        p = predict(dataclasses.replace(c, paper=None), hw)
        if p.status == "oom":
            oom.append(c.cell_id)
            lines[c.cell_id] = f"simulated on {hw.name}: OOM ({short_reason(p.error)})"
        elif p.status != "ok":
            lines[c.cell_id] = f"not simulated on {hw.name}: {short_reason(p.error)}"
        else:
            n = step_calls(c)
            calls = n * p.time_s
            over = (f"; over the {time_min:g}-minute limit" if calls > 60 * time_min else "")
            unit = "step" if c.workload == "train_step" else "call"
            lines[c.cell_id] = (f"simulated on {hw.name}: {p.time_s:.3g} s per {unit}, "
                                f"{n} calls {_duration(calls)}{over}; "
                                f"{p.memory.reserved_gib:.1f} GiB reserved")
    return lines, oom, host


def _duration(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _refuse_table_only(run_dir: Path) -> None:
    """A run kept as its table alone is never resumed: it would measure every cell again and
    replace the only copy of its rows."""
    if not store.has_rows(run_dir) and store.table_has_rows(run_dir):
        raise ValueError(f"run {run_dir.name} is kept as its table alone (no "
                         f"{store.ROWS}): it cannot be resumed; --new measures the sweep "
                         "in a new run and leaves this one as it is")


def _dry_run_sweep(spec: SweepSpec, cells, *, out, run_id, new, retry_failed, slurm,
                   job_folder, stream, hardware=None) -> None:
    """What a run would submit now: the cells its run has not done (a run it would refuse
    to resume, refused alike)."""
    resumed = select_run(spec, Path(out), run_id, new)
    if resumed.exists():
        _refuse_table_only(resumed)
    # a new run's id is its start time, unless named
    rid = resumed.name if resumed.exists() or run_id else "<run_id>"
    folder = (job_base(Path(job_folder).absolute(), spec.name, rid) if job_folder
              else Path(out).resolve() / spec.name / rid / "jobs")
    skip = _done(store.read_rows(resumed / "rows.jsonl"), retry_failed) if resumed.exists() \
        else set()
    queued = set(pending_jobs(resumed, "slurm")) - skip  # a dead driver's: not rerun
    ignore = skip | queued
    why = {c.cell_id: cell_problem(c) for c in cells if c.cell_id not in ignore}
    todo = [c for c in cells if c.cell_id in why and why[c.cell_id] is None]
    if skip or queued:
        print(f"{len(skip)} cells already done, {len(queued)} with jobs of an earlier driver "
              f"to collect, in {resumed}", file=stream)
    for c in cells:  # a skip_invalid method's cell: a skipped row, no job
        if why.get(c.cell_id):
            print(f"# not submitted, a skipped row: [{c.cell_id}] {c.describe()}: "
                  f"{why[c.cell_id]}", file=stream)
    predicted, oom, host = (_predictions(todo, hardware, slurm.time_min) if hardware
                            else (None, [], 0))
    dry_run(todo, slurm=slurm, sweep=spec.name, folder=str(folder), stream=stream,
            predicted=predicted)
    if host:
        print(f"# {host} of these cells run on CPUs: not simulated ({hardware} prices GPU "
              "runs)", file=stream)
    if oom:
        print(f"# {len(oom)} of these cells are predicted out of memory on {hardware}: each "
              "would be an oom row, its GPU-hours spent", file=stream)


def _report_interrupt(run: Run, cells, ids, *, executor: str, new: bool, stream) -> None:
    """After Ctrl-C: the table of what ran, and how to go on."""
    from burst.spawn import held_signals

    with held_signals(deliver=False):  # a second Ctrl-C must not leave the table half written
        store.consolidate(run.dir)  # first: a hung-up terminal fails the print below
    kept = len(_done(store.read_rows(run.rows), False) & set(ids))
    jobs = {"slurm": "; its SLURM jobs keep running and are collected when it resumes "
                     "(scancel stops them: their cells are then error rows, which "
                     "--retry-failed runs again)",
            "local": "; a local job still running is waited for when it resumes, one "
                     "that died runs again"}.get(executor, "")
    again = "the same command" + (" without --new" if new else "")
    text = (f"\ninterrupted: {kept} of {len(cells)} cells have a row in {run.dir}; "
            f"{again} resumes this run{jobs}")
    if kept == len(cells):  # Ctrl-C after the last row: nothing is left to resume
        text = (f"\ninterrupted after the last cell: every cell ({kept}) has a row in "
                f"{run.dir}, its table written; the run is complete")
    with contextlib.suppress(OSError):  # SIGHUP: the terminal is gone (EIO)
        print(text, file=stream, flush=True)


def _note_unfinished_other(sweep_dir: Path, spec: SweepSpec, stream,
                           ids: tuple[str, ...] = ()) -> None:
    """A spec edited after a run starts a new run: say that the older one is left unfinished
    (it resumes only with its own spec), or that it holds rows of cells (``ids``) that the new
    run measures again."""
    last = store.latest_run(sweep_dir) if sweep_dir.exists() else None
    if last is None:
        return
    meta = store.read_meta(last)
    if _same_spec(meta, spec, empty=False):
        return
    cells = meta.get("cells", [])
    try:
        have = {r.get("cell_id") for r in store.read_rows(last / store.ROWS)}
    except ValueError:  # another run's broken rows file is not this run's business
        return
    left = len(set(cells) - have)
    if not meta.get("spec_hash"):  # its run.json gone: its spec is unknown, not another
        if shared := len(have & set(ids)):
            # (a named run without run.json is resumed if its rows are all this spec's cells)
            then = (f" (--run-id {last.name} resumes that one instead)" if have <= set(ids)
                    else "")
            print(f"note: run {last.name} of this sweep has no run.json (its spec unknown) "
                  f"and rows of {shared} of these {len(ids)} cells; this spec starts a new "
                  f"run, which measures every cell{then}", file=stream, flush=True)
    elif left:
        print(f"note: run {last.name} of this sweep, of another spec, has {left} of "
              f"{len(cells)} cells without a row; this spec starts a new run (that one resumes "
              "with its own spec)", file=stream, flush=True)
    elif shared := len(have & set(ids)):
        print(f"note: run {last.name} of this sweep, of another spec, has rows of {shared} of "
              f"these {len(ids)} cells; this spec starts a new run, which measures every cell "
              "(a run resumes only with its own spec)", file=stream, flush=True)


def _code(commit, dirty) -> str:
    return f"{(commit or 'unknown')[:8]}{' (dirty)' if dirty else ''}"


def _warn_mixed_code(rows: list[dict], ctx: RunContext, stream) -> None:
    """Say so when a resumed run's rows come from other code than the cells it adds (each row
    keeps its own git_commit and git_dirty; the table and its speedups mix them)."""
    old = {_code(r.get("git_commit"), r.get("git_dirty")) for r in rows}
    now = _code(ctx.git_commit, ctx.git_dirty)
    unknown = ctx.git_commit is None or any(r.get("git_commit") is None for r in rows)
    if old - {now} or ctx.git_dirty or unknown:  # an unknown commit is not the same code
        print(f"note: this run's rows so far come from code {', '.join(sorted(old))}; the cells "
              f"added now run on {now}, and one table will hold both (--new measures every "
              "cell afresh)", file=stream, flush=True)


def _warn_changed_methods(rows: list[dict], done: set[str], stream) -> None:
    """Say so when a method given as an import path has changed since the rows this run keeps
    for its done cells (each cell's newest) were made (``method_source``'s hash; the path may
    differ between hosts): those cells are not run again, and their rows are the earlier
    code's (a user's method outside the repository has no commit to tell them apart)."""
    newest = {r["cell_id"]: r for r in rows if r.get("cell_id") in done}
    kept: dict[str, set] = {}
    for r in newest.values():
        if r.get("method_source"):
            kept.setdefault(r["method"], set()).add(r["method_source"])
    for method, sources in sorted(kept.items()):
        now = method_source(method, now=True)
        old = {s for s in sources if now is None or _hash(s) != _hash(now)}
        if old:
            print(f"note: method {method} is now {now or 'not readable'}; the rows of its "
                  f"cells done so far were made from {', '.join(sorted(old))} and are not "
                  "measured again (--new measures every cell afresh)", file=stream,
                  flush=True)


def _hash(source: str) -> str:
    return source.rpartition(" sha256:")[2]


def _done(rows: list[dict], retry_failed: bool) -> set[str]:
    """Cells a resumed run skips: every cell with a row, less the failed and skipped ones under
    ``retry_failed`` (a skipped cell's cause, no GPU or a missing package, may be gone)."""
    last = {r["cell_id"]: r["status"] for r in rows}
    return {i for i, s in last.items() if not (retry_failed and (s in FAILED or s == "skipped"))}


def _skip_invalid(cells: list[Cell], run: Run, ctx: RunContext) -> list[Cell]:
    """Cells a ``skip_invalid`` method cannot run become ``skipped`` rows without running."""
    keep = []
    for c in cells:
        why = cell_problem(c)
        if why is None:
            keep.append(c)
        else:
            store.append_row(run.rows, failure_row(c, why, ctx, "skipped"))
    return keep


WHY_CHARS = 240  # a failed cell's reason in the summary; longer ones are cut, marked "..."


def summary_text(table, spec: SweepSpec | None = None, *, baseline: str | None = None,
                 metrics: tuple[str, ...] | None = None) -> str:
    """Methods side by side for each cell: time per step with speedup against the baseline,
    then bytes sent per rank (and max error when measured); a training sweep's tokens/s,
    TFLOP/s and saved-for-backward bytes instead of bytes; a simulation's reserved memory."""
    if table is None or table.empty:
        return "(no rows)"
    baseline = baseline or (spec.baseline if spec else None)
    simulated = "source" in table and (table["source"] == "simulated").all()
    if metrics is None:
        metrics = ("time_s", "bytes_sent")
        if table.get("max_err") is not None and table["max_err"].notna().any():
            metrics += ("max_err",)
        model_tf = table.get("tflops_model_flops_causal")
        if model_tf is not None and model_tf.notna().any():
            metrics = ("time_s", "tokens_per_s", "tflops_model_flops_causal", "saved_bytes")
        if simulated:  # a prediction has no saved_bytes; its reserved peak decides OOM
            metrics = (*(m for m in metrics if m != "saved_bytes"), "mem_reserved_bytes")
    parts = []
    for m in metrics:
        title = METRICS[m][0]
        if m == "time_s" and baseline:
            title += f", speedup vs {baseline}"
        if m == "max_err":  # an ok cell without one was not checked, not found exact
            title += " (-: not checked, above the spec's error_max_tokens)"
        parts.append(render(summary(table, m, baseline=baseline), title=title))
    failed: dict[tuple, list[str]] = {}  # one line per (status, method, reason)
    for _, r in table[table["status"] != "ok"].iterrows():
        # the cause (the first rank's report, as the progress line quotes it); the whole
        # reason is in the row's error column
        err = r.get("error")
        why = short_reason(err, WHY_CHARS) if isinstance(err, str) and err.strip() else ""
        key = (r["status"], r["label"], why)
        failed.setdefault(key, []).append(f"{r['seq_len']}@{r['world']}")
    if failed:
        parts.append("\n".join(f"{st}: {label} at seq_len@world {', '.join(at)}: {why}"
                               for (st, label, why), at in failed.items())
                     + ("" if simulated else "\n(a resumed run counts these cells as done; "
                        "--retry-failed runs them again)"))
    return "\n\n".join(parts)


def _note_shared_cores(todo: list, executor: str, stream) -> None:
    """CPU ranks beyond this machine's cores share them: their times measure overheads and
    contention, not speed (a note, not a refusal: bytes and errors are still exact)."""
    cores = os.cpu_count() or 1
    world = max((c.world for c in todo if c.device == "cpu"), default=0)
    if executor in ("inline", "local") and world > cores:
        print(f"note: up to {world} CPU ranks on {cores} cores: ranks share cores, so times "
              "measure overheads and contention, not speed (bytes and errors are exact)",
              file=stream, flush=True)


def _held_jobs(run_dir: Path, kind: str, todo: list[Cell]) -> list[str]:
    """The cells of ``todo`` whose job an earlier driver of executor ``kind`` submitted and
    that executor collects: a SLURM job not collected, a local job still running or ended with
    an outcome no driver has read (one that died without one runs again)."""
    jobs = pending_jobs(run_dir, kind)
    return [c.cell_id for c in todo if c.cell_id in jobs
            and (kind == "slurm" or local_job_held(jobs[c.cell_id]))]


def _refuse_other_executors_jobs(run_dir: Path, todo: list, executor: str) -> None:
    """A cell whose job an earlier driver of another executor submitted, still running or
    ended with an outcome not yet collected (a local job), or not known to have ended (SLURM),
    is collected by that executor alone: run here, it would be measured twice at once, the two
    timings sharing the machine, or a finished measurement would be thrown away."""
    held = {}
    for kind in ("local", "slurm"):
        if kind == executor:
            continue
        cells = _held_jobs(run_dir, kind, todo)
        if cells:
            held[kind] = cells
    if held:
        raise ValueError(f"run {run_dir.name} has jobs of an earlier driver not yet collected ("
                         + "; ".join(f"{len(v)} {k}" for k, v in held.items())
                         + "): resume it with " + " or ".join(f"--executor {k}" for k in held)
                         + ", which collects them: the results of those that ended, and waits "
                         "for those still running")


def replace_slurm(base: SlurmSpec, **overrides) -> SlurmSpec:
    """The spec's [slurm] table with command-line values (None = keep) applied."""
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
