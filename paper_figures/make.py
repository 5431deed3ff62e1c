"""Regenerate every figure from the result tables (paper_figures/out/: PNG, PDF, CSV each).

    python -m paper_figures [--results results] [--out paper_figures/out] [--only NAME ...]

The simulated tables come from ``make figures`` (the simulator on the paper sweeps, then the
analytic breakdowns); measured tables are whatever the harness wrote under results/ (a row is
measured, simulated or published by its ``source`` column, wherever it lies). A figure whose
tables are absent is still drawn, with a note (``undrawn``: one line per figure), so the set is
always complete; a results folder with no table at all is refused (every figure would be empty).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from paper_figures import (
    ablation,
    attention_share,
    checkpoint_memory,
    cpu_sweep,
    kernel_tflops,
    logits_memory,
    main_throughput,
    memory_bars,
    weak_scaling,
)
from paper_figures.common import OUT, save
from paper_figures.tables import RESULTS, Tables, load_tables

__all__ = ["FIGURES", "main", "render_all", "undrawn", "unused_sweeps"]

FIGURES = (main_throughput, memory_bars, ablation, weak_scaling, kernel_tflops,
           attention_share, logits_memory, checkpoint_memory, cpu_sweep)


def render_all(tables: Tables, out: Path | str = OUT, only: list[str] | None = None
               ) -> dict[str, list[Path]]:
    done = {}
    for mod in FIGURES:
        if only and mod.NAME not in only:
            continue
        fig, data = mod.make(tables)
        done[mod.NAME] = save(fig, data, mod.NAME, out)
    return done


def sweeps_of(mod) -> list[str]:
    """The sweeps one figure reads (its SWEEP, SWEEPS, LONG), in that order."""
    out: list[str] = []
    for attr in ("SWEEP", "SWEEPS", "LONG"):
        v = getattr(mod, attr, None)
        out += [v] if isinstance(v, str) else list(v or ())
    return out


def drawn_sweeps() -> set[str]:
    """The sweeps the figures read (each module's SWEEP, SWEEPS, LONG)."""
    return {s for mod in FIGURES for s in sweeps_of(mod)}


# what a sweep figure draws of its sweeps (``drawn_rows``), unless the module says (DRAWS)
DRAWS = "the a800 simulation and runs measured on A800 GPUs"


def _found(tables, sweeps: list[str]) -> list[str]:
    """Where the rows of ``sweeps`` that were loaded come from: 'simulated on h200', ..."""
    out = []
    for src, df in (("simulated", tables.simulated), ("measured", tables.measured)):
        if df is None or not len(df) or "sweep" not in df:
            continue
        d = df[df["sweep"].isin(sweeps)]
        for hw in dict.fromkeys(d.get("hardware", pd.Series(dtype=object)).fillna("?")
                                .astype(str)):
            out.append(f"{src} on {hw}")
    return out


def undrawn(tables, only: list[str] | None = None) -> list[str]:
    """One note per figure (of ``only``, default all) that has nothing to draw of a sweep it
    reads, or no breakdowns: the figure is still written, but a reader of the command's output
    must not take it for drawn (rows simulated on another profile, measured elsewhere, or
    absent)."""
    where = tables.where()
    simulated = f"{where}simulated" if tables.root is not None else "results/simulated"
    notes, analytic = [], []
    for mod in FIGURES:
        if only and mod.NAME not in only:
            continue
        sweeps = sweeps_of(mod)
        if not sweeps:  # the analytic figures (suites.breakdowns)
            if not len(tables.breakdowns):
                analytic.append(mod.NAME)
            continue
        drawn = mod.drawn_rows(tables)
        have = set(drawn["sweep"].dropna().astype(str)) if len(drawn) else set()
        missing = [s for s in sweeps if s not in have]
        if not missing:
            continue
        found = _found(tables, missing)
        why = (f" (its rows there are {', '.join(found)}; the figure draws "
               f"{getattr(mod, 'DRAWS', DRAWS)})" if found else "")
        hint = "; ".join(f"burst-bench run {s}" if mod is cpu_sweep else
                         f"burst-bench simulate {s} --hardware a800 --out {simulated}"
                         for s in missing)
        notes.append(f"{mod.NAME}: nothing of sweep(s) {', '.join(missing)} to draw in "
                     f"{where}{why}; drawn without {'it' if len(missing) == 1 else 'them'} "
                     f"({hint})")
    if analytic:
        notes.append(f"{', '.join(analytic)}: no breakdowns.csv in {simulated}; drawn empty "
                     f"(python -m suites.breakdowns --out {simulated}/breakdowns.csv)")
    return notes


def unused_sweeps(tables) -> list[str]:
    """A note naming result sweeps no figure draws (a user's own sweep drew nothing, silently:
    the figures are the paper's, each reading its sweeps by name)."""
    found = set()
    for df in (tables.measured, tables.simulated):
        if len(df) and "sweep" in df:
            found.update(df["sweep"].dropna().astype(str))
    unused = sorted(found - drawn_sweeps())
    if not unused:
        return []
    return [f"no figure draws sweep(s) {', '.join(unused)}: each figure reads the paper's or "
            f"the CPU sweeps by name ({', '.join(sorted(drawn_sweeps()))}); `burst-bench show` "
            "and `compare` take any run"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="burst-bench figures", description=__doc__.split(
        "\n")[0] + " (also: python -m paper_figures)")
    ap.add_argument("--results", default=str(RESULTS),
                    help="results folder to read (default: %(default)s)")
    ap.add_argument("--out", default=str(OUT), help="where the figures go")
    ap.add_argument("--only", nargs="*", help="figure names (default: all)")
    a = ap.parse_args(argv)
    names = [m.NAME for m in FIGURES]
    if a.only == []:  # `--only` and no name: not "all" by accident
        ap.error(f"--only needs figure names; valid: {', '.join(names)}")
    bad = sorted(set(a.only or []) - set(names))
    if bad:
        ap.error(f"unknown figure(s) {bad}; valid: {', '.join(names)}")
    if not Path(a.results).is_dir():
        ap.error(f"--results {a.results}: " + ("a file, not a folder" if Path(a.results).exists()
                                                 else "no such folder"))
    if Path(a.out).exists() and not Path(a.out).is_dir():
        ap.error(f"--out {a.out} is a file, not a folder")
    tables = load_tables(a.results)
    if not (len(tables.simulated) or len(tables.measured) or len(tables.breakdowns)):
        ap.error(f"--results {a.results} holds no result table (no sweep run, nothing simulated):"
                 " every figure would be empty; `make figures` simulates the paper's sweeps "
                 "into results/simulated and draws them")
    unused = unused_sweeps(tables) if a.only is None else []  # asked for some: not the rest
    for note in tables.notes + unused + undrawn(tables, a.only):
        print(f"note: {note}", file=sys.stderr)
    done = render_all(tables, a.out, a.only)
    for name, paths in done.items():
        print(f"{name}: {', '.join(str(p) for p in paths)}")
    return 0
