"""Cross-validation of the simulator's fit: every published row predicted by constants fitted
without it.

The fit (``suites.calibrate``) chooses five time constants on the same 38 rows it is then judged
on, so its per-row error is an in-sample figure. Here each row is predicted out of sample, in
two ways:

- ``row``: leave one row out. The five time constants are refitted on the other 37 rows (the
  same loss, start and optimiser as the shipped fit) and the left-out row is predicted.
- ``panel``: leave one panel out (a kernel-table sequence length, or a model and GPU count of
  the training table): every row of the panel is predicted by constants fitted on the other
  panels, and the panel's ranking of methods is judged with them.

The memory constants stay as shipped (they do not move any time). The result is kept in
``results/simulator_crossval.csv``; ``python -m suites.calibrate`` reports it in
docs/simulator.md, and a test fails when the kept file no longer matches the shipped model.

    python -m suites.calibrate --crossval      # refit, then rerun every fold (46 fits)
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
BY = ("row", "panel")
# the row's identity in the fit's evaluation (calibrate.evaluate) and in the kept file
KEY = ("table", "model", "world", "seq_len", "method", "label", "checkpointing")
FIELDS = ["by", "fold", *KEY, "published", "simulated_fit", "simulated_cv", "rel_error_fit",
          "rel_error_cv", "status_cv", "panel_ranking_preserved", "constants_cv"]


def _key(e: dict) -> tuple:
    return tuple(e[k] for k in KEY)


def folds(evals: list[dict], by: str) -> list[tuple[str, list[int]]]:
    """(fold name, indices of the rows it leaves out) over the rows with a published number.
    Rows without one (published OOM cells) take no part in the time loss, so leaving them in
    every training set changes nothing."""
    from suites.calibrate import panel_name

    if by not in BY:
        raise ValueError(f"by={by!r}: choose one of {', '.join(BY)}")
    timed = [i for i, e in enumerate(evals) if e["published"] and e["status_paper"] == "ok"]
    if by == "row":
        return [(f"{panel_name(evals[i])} {evals[i]['label']}", [i]) for i in timed]
    out: dict[str, list[int]] = {}
    for i in timed:
        out.setdefault(panel_name(evals[i]), []).append(i)
    return list(out.items())


def _fold(job: tuple) -> list[dict]:
    """Fit the time constants without ``held``, then predict the rows in it."""
    from suites import calibrate as c
    from suites import hardware as hwmod
    from suites.implementations import implementations

    hw_name, by, name, held = job
    cells = c.paper_cells()
    train = [x for i, x in enumerate(cells) if i not in held]
    hw, impls = c._fit_group(hwmod.load(hw_name), implementations(), train, c.HW_TIME,
                             c.IMPL_TIME, c._time_loss)
    evals = c.evaluate(hw, impls, [cells[i] for i in held])
    consts = {x["name"]: round(float(x["value"]), 4) for x in c.constants(hw, impls)
              if x["name"].split(".", 1)[1] in c.HW_TIME
              or tuple(x["name"].split(".", 1)) in c.IMPL_TIME}
    preserved = all(r["preserved"] for r in c.rankings(evals)) if by == "panel" else None
    return [{"by": by, "fold": name, **{k: e[k] for k in KEY}, "simulated_cv": e["simulated"],
             "rel_error_cv": e["rel_error"], "status_cv": e["status_sim"],
             "panel_ranking_preserved": preserved,
             "constants_cv": "; ".join(f"{k}={v}" for k, v in consts.items())}
            for e in evals]


def crossval(fitted: list[dict], hw_name: str, by: tuple[str, ...] = BY, jobs: int = 2,
             log=None) -> list[dict]:
    """Every fold of ``by`` (``row``, ``panel``), ``jobs`` fits at a time (about 20 s each on
    one core); ``fitted`` is the shipped fit's evaluation (``calibrate.evaluate``), whose rows
    the folds leave out and whose predictions sit next to theirs."""
    log = log or sys.stderr
    work = [(hw_name, b, name, held) for b in by for name, held in folds(fitted, b)]
    ins = {_key(e): e for e in fitted}
    rows, t0 = [], time.monotonic()
    print(f"cross-validation: {len(work)} refits of the time constants, {jobs} at a time "
          "(about 20 s each)", file=log, flush=True)
    # spawn: the workers import torch (burst.flops) afresh instead of inheriting a forked copy;
    # one job runs in this process
    with (ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) if jobs > 1
          else nullcontext()) as pool:
        for n, got in enumerate((pool.map if pool else map)(_fold, work), 1):
            for r in got:
                e = ins[tuple(r[k] for k in KEY)]
                r.update(published=e["published"], simulated_fit=e["simulated"],
                         rel_error_fit=e["rel_error"])
            rows += got
            errs = ", ".join(f"{100 * r['rel_error_cv']:+.1f}%" for r in got
                             if r["published"] and r["rel_error_cv"] is not None)
            print(f"  [{n}/{len(work)}] {time.monotonic() - t0:6.0f} s  {work[n - 1][1]} "
                  f"{work[n - 1][2]}: {errs or 'no number'}", file=log, flush=True)
    return rows


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
    def num(v):
        return None if v in ("", None) else float(v)

    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            r.update({k: num(r[k]) for k in ("published", "simulated_fit", "simulated_cv",
                                             "rel_error_fit", "rel_error_cv")})
            r.update(world=int(r["world"]), seq_len=int(r["seq_len"]),
                     panel_ranking_preserved={"True": True, "False": False}.get(
                         r["panel_ranking_preserved"]))
            out.append(r)
    return out


def stale_rows(kept: list[dict], fitted: list[dict], rel: float = 1e-4) -> list[str]:
    """Rows whose in-sample prediction in the kept file is not what the shipped model gives
    now, or that the kept file lacks: the cross-validation was run on another model."""
    now = {_key(e): e for e in fitted if e["published"] and e["status_paper"] == "ok"}
    bad = []
    for by in BY:
        seen = {_key(r): r for r in kept if r["by"] == by}
        for k, e in now.items():
            r = seen.get(k)
            if r is None:
                bad.append(f"{by}: {' '.join(map(str, k))} missing")
            elif e["simulated"] is None or r["simulated_fit"] is None or not math.isclose(
                    r["simulated_fit"], e["simulated"], rel_tol=rel):
                bad.append(f"{by}: {' '.join(map(str, k))} kept {r['simulated_fit']}, "
                           f"now {e['simulated']}")
    return bad


def summarise(kept: list[dict]) -> dict[str, dict]:
    """Per ``by``: rows, median and worst |error| in and out of sample, rows within 10% / 25%
    out of sample, and (panels) how many panels keep their ranking."""
    out = {}
    for by in BY:
        rs = [r for r in kept if r["by"] == by and r["published"]]
        if not rs:
            continue
        cv = [abs(r["rel_error_cv"]) if r["rel_error_cv"] is not None else math.inf for r in rs]
        fit = [abs(r["rel_error_fit"]) for r in rs]
        s = {"rows": len(rs), "median_fit": statistics.median(fit), "worst_fit": max(fit),
             "median_cv": statistics.median(cv), "worst_cv": max(cv),
             "within_10pct": sum(x <= 0.10 for x in cv), "within_25pct": sum(x <= 0.25 for x in cv)}
        worst = max(rs, key=lambda r: abs(r["rel_error_cv"] or math.inf))
        s["worst_row"] = worst
        if by == "panel":
            panels = {r["fold"]: r["panel_ranking_preserved"] for r in rs}
            s.update(panels=len(panels), panels_ranking_preserved=sum(map(bool, panels.values())))
        out[by] = s
    return out
