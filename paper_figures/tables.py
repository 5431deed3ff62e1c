"""The result tables the figures are drawn from: published, simulated, measured, breakdowns.

    t = load_tables()                      # results/ of this checkout
    t.paper, t.simulated, t.measured       # DataFrames in results.schema columns + ``system``
    t.breakdowns                           # suites.breakdowns' long table

``system`` is the paper's system name when a row reproduces one (spec JSON ``paper``), else the
registry method: it picks the colour (``palette``) and lines rows of different sources up.
Everything here only reads files; figures are pure functions of a ``Tables``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from results.schema import COLUMNS

__all__ = ["RESULTS", "Tables", "add_system", "load_tables"]

RESULTS = Path(__file__).resolve().parent.parent / "results"
SIMULATED = "simulated"  # results/simulated/<sweep>/simulated-<hardware>/table.csv
SKIP = {SIMULATED, "paper_reference", "__pycache__"}


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=[*COLUMNS, "system"])


@dataclass
class Tables:
    paper: pd.DataFrame = field(default_factory=_empty)
    simulated: pd.DataFrame = field(default_factory=_empty)
    measured: pd.DataFrame = field(default_factory=_empty)
    breakdowns: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)
    """What loading left out that a reader should know (older runs with more rows)."""


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


def _frames(runs: list[Path]) -> pd.DataFrame:
    from results import store

    parts = []
    for run in runs:
        try:  # from its rows, as burst-bench show reads it (a table may lag behind its rows)
            parts.append(store.load(run))
        except (OSError, ValueError, pd.errors.EmptyDataError):
            continue
    if not parts:
        return _empty()
    return add_system(pd.concat(parts, ignore_index=True))


def _row_count(run: Path) -> int:
    from results import store

    try:
        with open(run / store.ROWS, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _run_hardware(run: Path) -> str:
    """A run's hardware: run.json's (simulated runs), else its first row's (measured runs
    record the device per row)."""
    from results import store

    hw = store.read_meta(run).get("hardware")
    if hw:
        return str(hw)
    try:
        with open(run / store.ROWS) as f:
            for line in f:
                if line.strip():
                    return str(json.loads(line).get("hardware") or "")
    except (OSError, ValueError):
        pass
    return ""


def _latest_tables(root: Path, notes: list[str]) -> list[Path]:
    """The latest run folder of every sweep folder under ``root``, per hardware
    (``_run_hardware``: a run on another profile or GPU does not hide the A800 one): the
    run ``results.store.latest_run`` picks (by creation time, not name), so a figure never shows
    an older run than ``burst-bench show``. Runs are never mixed; an older run with more rows
    than the one shown is named in ``notes``."""
    from results import store

    if not root.is_dir():
        return []
    out = []
    for sweep in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in SKIP):
        by_hw: dict[str, list[Path]] = {}
        for run in store.runs_by_time(sweep):
            by_hw.setdefault(_run_hardware(run), []).append(run)
        for runs in by_hw.values():
            counts = {r: _row_count(r) for r in runs}
            shown, n = runs[-1], counts[runs[-1]]
            out.append(shown)
            fuller = [f"{r.name} ({counts[r]} rows)" for r in runs[:-1] if counts[r] > n]
            if fuller:
                notes.append(f"{sweep}: showing the latest run {shown.name} ({n} rows); older "
                             f"runs with more rows are not shown: {', '.join(fuller)}")
    return out


PAPER_PROFILE = "a800"  # the paper's cluster: the profile its figures draw


def load_tables(results: Path | str = RESULTS) -> Tables:
    from results.paper import paper_rows

    results = Path(results)
    if not results.is_dir():
        raise FileNotFoundError(f"no results folder {results}")
    breakdowns = results / SIMULATED / "breakdowns.csv"
    notes: list[str] = []
    simulated = _frames(_latest_tables(results / SIMULATED, notes))
    if len(simulated) and "hardware" in simulated:
        profiles = sorted(set(simulated["hardware"].dropna().astype(str)))
        if PAPER_PROFILE not in profiles:  # the figures drew empty, with no word why
            notes.append(f"the paper's figures draw the {PAPER_PROFILE} simulation (the "
                         f"paper's cluster); {results / SIMULATED} holds only "
                         f"{', '.join(profiles)}: simulate --hardware {PAPER_PROFILE} there")
    return Tables(
        paper=add_system(pd.DataFrame(paper_rows())),
        simulated=simulated,
        measured=_frames(_latest_tables(results, notes)),
        breakdowns=pd.read_csv(breakdowns) if breakdowns.exists() else pd.DataFrame(),
        notes=notes,
    )
