"""The result tables the figures are drawn from: published, simulated, measured, breakdowns.

    t = load_tables()                      # results/ of this checkout
    t.paper, t.simulated, t.measured       # DataFrames in results.schema columns + ``system``
    t.breakdowns                           # suites.breakdowns' long table

``system`` is the paper's system name when a row reproduces one (spec JSON ``paper``), else the
registry method: it picks the colour (``palette``) and lines rows of different sources up.
A row is measured, simulated or published by its ``source`` column (the schema's provenance),
wherever its run lies: ``results/simulated/`` is only where ``make figures`` puts the simulated
runs (a row without a source is taken from where it lies: simulated there, measured elsewhere).
Everything here only reads files; figures are pure functions of a ``Tables``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from results.schema import COLUMNS

__all__ = ["RESULTS", "Tables", "add_system", "load_tables"]

RESULTS = Path(__file__).resolve().parent.parent / "results"
SIMULATED = "simulated"  # results/simulated/<sweep>/simulated-<hardware>/table.csv
SKIP = {"paper_reference", "__pycache__"}
# runs no figure draws, by their run.json's sweep: the GPU check's rows (tests, kernels and a 1B
# model on one GPU, scripts/gpu_check.py) have no sequence length where they are tests, which made
# every length of the measured table a float
NOT_DRAWN = {"gpu_check"}
SOURCES = ("measured", "simulated", "paper")  # the schema's ``source`` values, Tables' frames


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=[*COLUMNS, "system"])


@dataclass
class Tables:
    paper: pd.DataFrame = field(default_factory=_empty)
    simulated: pd.DataFrame = field(default_factory=_empty)
    measured: pd.DataFrame = field(default_factory=_empty)
    breakdowns: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)
    """What loading left out that a reader should know (older runs with more cells)."""
    root: Path | None = None
    """The results folder the tables were read from (None: tables built by hand)."""

    def where(self) -> str:
        """The folder read, as a figure or a note names it (relative to the working directory
        when inside it)."""
        if self.root is None:
            return "the tables given"
        try:
            rel = Path(os.path.relpath(Path(self.root).resolve(), Path.cwd()))
        except ValueError:  # another drive
            return f"{self.root}/"
        return f"{self.root if rel.parts[:1] == ('..',) else rel}/"


def _system(row) -> str:
    try:
        paper = json.loads(row.get("spec") or "{}").get("paper")
    except (TypeError, ValueError):
        paper = None
    return paper or row.get("method") or ""


def add_system(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["system"] = [_system(r) for r in df.to_dict("records")] if len(df) else []
    return df


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    return add_system(pd.concat(parts, ignore_index=True)) if parts else _empty()


def _frames(runs: list[Path], results: Path, notes: list[str]
            ) -> tuple[dict[str, list[pd.DataFrame]], set[Path]]:
    """The rows of ``runs`` per source (``SOURCES``), by each row's ``source`` column; a row
    without one is simulated under ``results/simulated``, else measured. Also the runs that
    gave simulated rows. A run that cannot be read is named in ``notes`` with the reason."""
    from results import store

    parts: dict[str, list[pd.DataFrame]] = {k: [] for k in SOURCES}
    simulated_runs = set()
    for run in runs:
        try:  # from its rows, as burst-bench show reads it (a table may lag behind its rows)
            df = store.load(run)
        except (OSError, ValueError, pd.errors.EmptyDataError) as e:
            notes.append(f"{run}: not drawn, its rows cannot be read ({e}); "
                         f"burst-bench show {run} says the same")
            continue
        fallback = "simulated" if results / SIMULATED in run.parents else "measured"
        if len(df) and "hardware" in df:  # a cell skipped before it ran names no hardware
            named = df["hardware"].notna() & (df["hardware"].astype(str) != "")
            df["hardware"] = df["hardware"].where(named, _run_hardware(run) or None)
        if not len(df):
            parts[fallback].append(df)
            continue
        src = df["source"] if "source" in df else pd.Series(None, index=df.index, dtype=object)
        src = src.where(src.notna() & (src.astype(str) != ""), fallback).astype(str)
        src = src.where(src.isin(SOURCES), "measured")  # any other provenance: not ours
        for kind in SOURCES:
            sel = src == kind
            if sel.any():
                parts[kind].append(df[sel])
        if (src == "simulated").any():
            simulated_runs.add(run)
    return parts, simulated_runs


def _cell_count(run: Path) -> int:
    """The cells of a run, as its table holds them (a retried cell once; a run kept as its
    table alone counts too); 0 for one that cannot be read (its load says why)."""
    from results import store

    try:
        return len(store.load(run))
    except (OSError, ValueError):
        return 0


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _run_hardware(run: Path) -> str:
    """A run's hardware: run.json's (simulated runs), else that of its first row that names one
    (measured runs record the device per row; a cell skipped before it ran names none)."""
    from results import store

    hw = store.read_meta(run).get("hardware")
    if hw:
        return str(hw)
    try:
        with open(run / store.ROWS) as f:
            lines = [line for line in f if line.strip()]
    except OSError:
        return ""
    for line in lines:
        try:
            hw = json.loads(line).get("hardware")
        except ValueError:  # a torn line: the next may name it
            continue
        if hw:
            return str(hw)
    return ""


def _latest_tables(root: Path, notes: list[str], depth: int = 1) -> list[Path]:
    """The latest run folder of every sweep folder under ``root``, per hardware
    (``_run_hardware``: a run on another profile or GPU does not hide the A800 one): the
    run ``results.store.latest_run`` picks (by creation time, not name), so a figure never shows
    an older run than ``burst-bench show``. Runs are never mixed; an older run with more cells
    than the one shown is named in ``notes``. A folder without runs is a folder of sweep
    folders (``results/simulated``, or any other: ``simulate --out``), ``depth`` levels down."""
    from results import store

    if not root.is_dir():
        return []
    out = []
    for sweep in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in SKIP):
        found = store.runs_by_time(sweep)
        if not found:
            if depth > 0:
                out += _latest_tables(sweep, notes, depth - 1)
            continue
        found = [r for r in found if store.read_meta(r).get("sweep") not in NOT_DRAWN]
        by_hw: dict[str, list[Path]] = {}
        for run in found:
            by_hw.setdefault(_run_hardware(run), []).append(run)
        for runs in by_hw.values():
            counts = {r: _cell_count(r) for r in runs}
            shown, n = runs[-1], counts[runs[-1]]
            out.append(shown)
            fuller = [f"{r.name} ({_cells(counts[r])})" for r in runs[:-1] if counts[r] > n]
            if fuller:
                notes.append(f"{sweep}: showing the latest run {shown.name} ({_cells(n)}); older "
                             f"runs with more cells are not shown: {', '.join(fuller)}")
    return out


PAPER_PROFILE = "a800"  # the paper's cluster: the profile its figures draw


def _published(extra: list[pd.DataFrame]) -> pd.DataFrame:
    """The reference tables' published rows (``results.paper``), and rows with
    ``source=paper`` found in the results folder that are not one of them."""
    from results.paper import paper_rows

    paper = add_system(pd.DataFrame(paper_rows()))
    if not extra:
        return paper
    keys = ["workload", "model", "world", "seq_len", "label", "checkpointing"]
    more = _concat(extra)
    known = set(map(tuple, paper.reindex(columns=keys).astype(str).to_numpy()))
    new = [tuple(k) not in known for k in more.reindex(columns=keys).astype(str).to_numpy()]
    return pd.concat([paper, more[new]], ignore_index=True)


def load_tables(results: Path | str = RESULTS) -> Tables:
    results = Path(results)
    if not results.is_dir():
        raise FileNotFoundError(f"no results folder {results}")
    breakdowns = results / SIMULATED / "breakdowns.csv"
    if not breakdowns.exists() and (results / "breakdowns.csv").exists():
        breakdowns = results / "breakdowns.csv"  # --results results/simulated
    notes: list[str] = []
    parts, simulated_runs = _frames(_latest_tables(results, notes), results, notes)
    simulated = _concat(parts["simulated"])
    if len(simulated) and "hardware" in simulated:
        profiles = sorted(set(simulated["hardware"].dropna().astype(str)))
        if PAPER_PROFILE not in profiles:  # the figures drew empty, with no word why
            held = (results / SIMULATED if all(results / SIMULATED in r.parents
                                               for r in simulated_runs) else results)
            notes.append(f"the paper's figures draw the {PAPER_PROFILE} simulation (the "
                         f"paper's cluster); {held} holds only "
                         f"{', '.join(profiles)}: simulate --hardware {PAPER_PROFILE} there")
    return Tables(
        paper=_published(parts["paper"]),
        simulated=simulated,
        measured=_concat(parts["measured"]),
        breakdowns=pd.read_csv(breakdowns) if breakdowns.exists() else pd.DataFrame(),
        notes=notes,
        root=results,
    )
