"""Cross-validation of the simulator's fit: every published row predicted by constants fitted
without it.

The fit (``suites.calibrate``) chooses its eight constants on the rows it is then judged on, so
its per-row error is an in-sample figure. Here each throughput row is predicted out of sample,
in two ways, by all eight constants refitted without it (the same losses, starts and optimisers
as the shipped fit; the memory constants first, so whether the row runs at all is decided
without it too, then the time constants):

- ``row``: leave one row out, predict it from the other 37;
- ``panel``: leave one panel out (a kernel-table sequence length, or a model and GPU count of
  the training table): every row of the panel is predicted by constants fitted on the other
  panels, and the panel's ranking of methods is judged with them.

The memory constants (allocator overhead, the global per-token buffers of InternEvo and
DeepSpeed) are also cross-validated alone over the training cells their fit weighs
(``memory_row``, ``memory_panel``; the time constants as shipped: they move no memory). The
result is kept in ``results/simulator_crossval.csv``; ``python -m suites.calibrate`` reports it
in docs/simulator.md, and tests fail when the kept file no longer matches the shipped model.

    python -m suites.calibrate --crossval      # refit, then rerun every fold
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path

__all__ = ["CSV", "folds", "crossval", "read", "stale_rows", "summarise", "write"]

CSV = Path(__file__).resolve().parent.parent / "results" / "simulator_crossval.csv"
TIME_BY = ("row", "panel")  # all eight constants refitted, throughput rows predicted
MEMORY_BY = ("memory_row", "memory_panel")  # the three memory constants alone
BY = TIME_BY + MEMORY_BY
# the row's identity in the fit's evaluation (calibrate.evaluate) and in the kept file
KEY = ("table", "model", "world", "seq_len", "method", "label", "checkpointing")
# what the shipped fit gives each row (calibrate.evaluate's name after the colon)
FIT = {"published": "published", "simulated_fit": "simulated", "rel_error_fit": "rel_error",
       "status_paper": "status_paper", "status_fit": "status_sim",
       "mem_paper_gib": "mem_paper_gib", "mem_sim_fit": "mem_sim_gib",
       "mem_rel_error_fit": "mem_rel_error"}
FIELDS = ["by", "fold", *KEY, *FIT, "simulated_cv", "rel_error_cv", "status_cv", "mem_sim_cv",
          "mem_rel_error_cv", "panel_ranking_preserved", "constants_cv"]
NUMBERS = ("published", "simulated_fit", "simulated_cv", "rel_error_fit", "rel_error_cv",
           "mem_paper_gib", "mem_sim_fit", "mem_sim_cv", "mem_rel_error_fit", "mem_rel_error_cv")


def _key(e: dict) -> tuple:
    return tuple(e[k] for k in KEY)


def _members(evals: list[dict], by: str) -> list[int]:
    """The rows a fold of ``by`` may leave out: those the time fit weighs (a published number;
    the others take no part in the time loss), or those the memory fit weighs."""
    from suites.calibrate import weighs_memory, weighs_time

    weighs = weighs_time if by in TIME_BY else weighs_memory
    return [i for i, e in enumerate(evals) if weighs(e)]


def folds(evals: list[dict], by: str) -> list[tuple[str, list[int]]]:
    """(fold name, indices of the rows it leaves out): one row each (``row``, ``memory_row``)
    or one panel each (``panel``, ``memory_panel``)."""
    from suites.calibrate import panel_name

    if by not in BY:
        raise ValueError(f"by={by!r}: choose one of {', '.join(BY)}")
    members = _members(evals, by)
    if by.endswith("row"):
        return [(f"{panel_name(evals[i])} {evals[i]['label']}", [i]) for i in members]
    out: dict[str, list[int]] = {}
    for i in members:
        out.setdefault(panel_name(evals[i]), []).append(i)
    return list(out.items())


def _fold(job: tuple) -> list[dict]:
    """Fit the memory constants (and, for a time fold, then the time constants) without
    ``held``, then predict the rows in it."""
    from suites import calibrate as c
    from suites import hardware as hwmod
    from suites.implementations import implementations

    hw_name, by, name, held = job
    cells = c.paper_cells()
    train = [x for i, x in enumerate(cells) if i not in held]
    # the memory constants first (the time constants move no memory): whether a held-out row
    # runs at all is then decided without it too (the shipped memory fit weighs its status)
    hw, impls = c._fit_memory(hwmod.load(hw_name), implementations(), train)
    refit = {*c.HW_MEMORY, *(k for _, k in c.IMPL_MEMORY)}
    timed = by in TIME_BY  # a memory fold's throughput is the shipped time constants': left out
    if timed:
        hw, impls = c._fit_group(hw, impls, train, c.HW_TIME, c.IMPL_TIME, c._time_loss)
        refit |= {*c.HW_TIME, *(k for _, k in c.IMPL_TIME)}
    evals = c.evaluate(hw, impls, [cells[i] for i in held])
    consts = {x["name"]: round(float(x["value"]), 4) for x in c.constants(hw, impls)
              if x["name"].rsplit(".", 1)[1] in refit}
    preserved = all(r["preserved"] for r in c.rankings(evals)) if by == "panel" else None
    return [{"by": by, "fold": name, **{k: e[k] for k in KEY},
             "simulated_cv": e["simulated"] if timed else None,
             "rel_error_cv": e["rel_error"] if timed else None, "status_cv": e["status_sim"],
             "mem_sim_cv": e["mem_sim_gib"], "mem_rel_error_cv": e["mem_rel_error"],
             "panel_ranking_preserved": preserved,
             "constants_cv": "; ".join(f"{k}={v}" for k, v in consts.items())}
            for e in evals]


def crossval(fitted: list[dict], hw_name: str, by: tuple[str, ...] = BY, jobs: int = 2,
             log=None) -> list[dict]:
    """Every fold of ``by``, ``jobs`` fits at a time (a time fold takes about 20 s on one
    core, a memory fold under a second; all 86, two at a time: about 8 minutes); ``fitted`` is
    the shipped fit's evaluation (``calibrate.evaluate``), whose rows the folds leave out and
    whose predictions sit next to theirs."""
    log = log or sys.stderr
    work = [(hw_name, b, name, held) for b in by for name, held in folds(fitted, b)]
    ins = {_key(e): e for e in fitted}
    rows, t0 = [], time.monotonic()
    print(f"cross-validation: {len(work)} refits, {jobs} at a time", file=log, flush=True)
    # spawn: the workers import torch (burst.flops) afresh instead of inheriting a forked copy;
    # one job runs in this process
    with (ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) if jobs > 1
          else nullcontext()) as pool:
        for n, got in enumerate((pool.map if pool else map)(_fold, work), 1):
            for r in got:
                e = ins[_key(r)]
                r.update({field: e[name] for field, name in FIT.items()})
            rows += got
            print(f"  [{n}/{len(work)}] {time.monotonic() - t0:6.0f} s  {work[n - 1][1]} "
                  f"{work[n - 1][2]}: {', '.join(map(_shown, got))}", file=log, flush=True)
    return rows


def _shown(r: dict) -> str:
    """A row's out-of-sample prediction, as the progress line gives it."""
    if r["by"] in TIME_BY:
        return "no number" if r["rel_error_cv"] is None else f"{100 * r['rel_error_cv']:+.1f}%"
    mem = "" if r["mem_sim_cv"] is None else f" {r['mem_sim_cv']:.1f} GiB"
    return f"{r['status_cv']}{mem} (paper {r['status_paper']})"


def write(rows: list[dict], path: Path = CSV) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})
    tmp.replace(path)


def read(path: Path = CSV) -> list[dict]:
    """The kept rows, numbers as numbers (empty cells as None)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            r.update({k: None if r[k] == "" else float(r[k]) for k in NUMBERS})
            r.update(world=int(r["world"]), seq_len=int(r["seq_len"]),
                     panel_ranking_preserved={"True": True, "False": False}.get(
                         r["panel_ranking_preserved"]))
            out.append(r)
    return out


def _same(a, b, rel: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel)


def stale_rows(kept: list[dict], fitted: list[dict], rel: float = 1e-6) -> list[str]:
    """Rows whose published values or in-sample prediction in the kept file are not what the
    paper's tables and the shipped model give now (throughput, memory or status), or that the
    kept file lacks: the cross-validation was run on other data or another model. (The folds'
    own predictions are not recomputed here: ``tests/test_crossval.py`` reruns the memory
    folds, which take seconds; the time folds take minutes.)"""
    bad = []
    for by in BY:
        seen = {_key(r): r for r in kept if r["by"] == by}
        for i in _members(fitted, by):
            e, k = fitted[i], _key(fitted[i])
            r = seen.get(k)
            if r is None:
                bad.append(f"{by}: {' '.join(map(str, k))} missing")
                continue
            was = (r["simulated_fit"], r["mem_sim_fit"], r["published"], r["mem_paper_gib"],
                   r["status_fit"], r["status_paper"])
            now = (e["simulated"], e["mem_sim_gib"], e["published"], e["mem_paper_gib"],
                   e["status_sim"], e["status_paper"])
            if not (all(_same(a, b, rel) for a, b in zip(was[:4], now[:4], strict=True))
                    and was[4:] == now[4:]):
                bad.append(f"{by}: {' '.join(map(str, k))} kept {was}, now {now}")
    return bad


def summarise(kept: list[dict]) -> dict[str, dict]:
    """Per ``by``. Time: rows, median and worst |error| in and out of sample, rows within
    10% / 25% out of sample, and (panels) how many panels keep their ranking. Memory: the same
    errors over the cells with a published memory, and how many published OOM cells, and how
    many published runs, are predicted OOM in and out of sample."""
    out = {}
    def errors(rs, field):  # a row given no number (predicted OOM) counts as infinitely off
        return [math.inf if r[field] is None else abs(r[field]) for r in rs]

    for by in TIME_BY:
        rs = [r for r in kept if r["by"] == by and r["published"]]
        if not rs:
            continue
        cv, fit = errors(rs, "rel_error_cv"), errors(rs, "rel_error_fit")
        numbered = [r for r in rs if r["rel_error_cv"] is not None]
        s = {"rows": len(rs), "median_fit": statistics.median(fit), "worst_fit": max(fit),
             "median_cv": statistics.median(cv),
             "worst_cv": max((abs(r["rel_error_cv"]) for r in numbered), default=math.nan),
             "within_10pct": sum(x <= 0.10 for x in cv), "within_25pct": sum(x <= 0.25 for x in cv),
             "worst_row": max(numbered, key=lambda r: abs(r["rel_error_cv"]), default=None),
             "no_number_fit": sum(r["rel_error_fit"] is None for r in rs),
             "no_number": [r for r in rs if r["rel_error_cv"] is None]}
        if by == "panel":
            panels = {r["fold"]: r["panel_ranking_preserved"] for r in rs}
            s.update(panels=len(panels), panels_ranking_preserved=sum(map(bool, panels.values())))
        out[by] = s
    for by in MEMORY_BY:
        rs = [r for r in kept if r["by"] == by]
        if not rs:
            continue
        mem = [r for r in rs if r["mem_paper_gib"]]
        oom = [r for r in rs if r["status_paper"] == "oom"]
        ran = [r for r in rs if r["status_paper"] == "ok"]
        out[by] = {
            "cells": len(rs), "folds": len({r["fold"] for r in rs}), "memory_rows": len(mem),
            "median_fit": statistics.median(errors(mem, "mem_rel_error_fit")),
            "worst_fit": max(errors(mem, "mem_rel_error_fit")),
            "median_cv": statistics.median(errors(mem, "mem_rel_error_cv")),
            "worst_cv": max(errors(mem, "mem_rel_error_cv")),
            "oom_cells": len(oom), "oom_fit": sum(r["status_fit"] == "oom" for r in oom),
            "oom_cv": sum(r["status_cv"] == "oom" for r in oom),
            "ok_cells": len(ran), "ok_oom_fit": sum(r["status_fit"] == "oom" for r in ran),
            "ok_oom_cv": sum(r["status_cv"] == "oom" for r in ran)}
    return out
