"""Measured on local CPU ranks (the harness's CPU sweeps, gloo), next to the simulator.

Top (``cpu_scaling``, 2-8 ranks, at the sweep's longest measured length; its shorter ones are in
its run's table, not drawn): bytes sent per rank per attention layer (counted by the byte
counter: markers; the simulator's formula for the same cells: lines) and the measured speedup
over the sweep's baseline. Bottom (``cpu_long``, 256K and 1M tokens on 8 ranks, sliding window):
bytes per rank against the formula, and the measured transient peak memory per rank. Cells
without a number (skipped, oom, error, timeout) are marked at the bottom of their panel and kept
in the CSV with their status and an empty value. Measured runs of a sweep on several machines:
the newest machine's rows are drawn; of a point given twice, the later row.

Methods can send the same bytes (ring, burst[bwd=ring] and zigzag_ring do): each method has its
own marker, line style and width (``series_styles``: earlier ones wider and larger, so that a
line or marker drawn over an equal one leaves it visible), and a panel names the methods whose
values coincide (``coinciding``)."""

from __future__ import annotations

import json

import pandas as pd

from paper_figures._bars import mark_failures
from paper_figures.common import new_figure, note_empty, seq_label, wrap_path
from paper_figures.palette import ORDER, series_color
from suites.hardware import GIB

NAME = "cpu_sweep"
SWEEP, LONG = "cpu_scaling", "cpu_long"
DRAWS = "measured runs (CPU ranks, any machine), the simulator's bytes beside them"
HARDWARE = "a800"  # the profile the simulated lines come from (bytes do not depend on it)
FLOOR = 0.03  # axes fraction where cells without a number are marked
MARKERS = ("s", "o", "^", "v", "P", "X", "<", ">", "h")  # no diamond: it means "published"
LINESTYLES = ("-", "--", "-.", ":")


def series_styles(labels: list[tuple[str, str]]) -> dict[str, dict]:
    """Per (label, system), in drawing order: its colour (``palette.series_color``), its own
    marker and line style, and a width and marker size that shrink along the order, so that
    of two equal series the one drawn later sits inside the earlier one."""
    out = {}
    for k, (label, system) in enumerate(labels):
        out[label] = {"color": series_color(system, label), "marker": MARKERS[k % len(MARKERS)],
                      "ls": LINESTYLES[k % len(LINESTYLES)], "lw": max(0.9, 2.6 - 0.35 * k),
                      "s": max(12.0, 110.0 * 0.62**k)}
    return out


def coinciding(df: pd.DataFrame, x: str, column: str) -> list[list[str]]:
    """Groups (two or more) of labels whose drawn values are equal at every x, per source."""
    keys: dict[tuple, list[str]] = {}
    for label, d in _by_label(df):
        ok = d[d["status"] == "ok"]
        key = tuple(sorted((str(r["source"]), r[x], round(float(r[column]), 6))
                           for r in ok.to_dict("records") if pd.notna(r[column])))
        if key:
            keys.setdefault(key, []).append(label)
    return [g for g in keys.values() if len(g) > 1]


def _note_coinciding(ax, df: pd.DataFrame, x: str, column: str) -> None:
    groups = coinciding(df, x, column)
    if groups:
        ax.text(0.02, 0.98, "equal values, drawn over each other:\n"
                + "\n".join(" = ".join(g) for g in groups), transform=ax.transAxes,
                ha="left", va="top", fontsize=6, color="0.2",
                bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.85, "pad": 2})


def _rows(tables, sweep: str) -> pd.DataFrame:
    parts = []
    for src, df in (("measured", tables.measured), ("simulated", tables.simulated)):
        if df is None or not len(df):
            continue
        d = df[(df["sweep"] == sweep) & (df["workload"] == "attention")].copy()
        if src == "simulated":  # one line per label
            d = d[d["hardware"] == HARDWARE]
        elif d["hardware"].nunique() > 1:  # runs on several machines: the newest one's
            newest = d.sort_values("date", na_position="first")["hardware"].iloc[-1]
            d = d[d["hardware"] == newest]
        d["source"] = src
        # one row per drawn point, the last given (as the other figures): tables holding a
        # cell twice (two runs concatenated by hand) drew both, and the speedup's map crashed
        parts.append(d.drop_duplicates(["label", "world", "seq_len"], keep="last"))
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True)
    # a row without a byte count is missing, not zero (results/README.md)
    df["bytes"] = df["bytes_sent_forward"] + df["bytes_sent_backward"]
    return df


def _drawn(df: pd.DataFrame) -> bool:
    """A sweep's panels are drawn when it has a measured row (the formula's lines alone are
    not a measurement)."""
    return bool(len(df)) and bool((df["source"] == "measured").any())


def drawn_rows(tables) -> pd.DataFrame:
    """The rows of ``SWEEP`` and ``LONG`` the figure draws (none of a sweep not measured)."""
    parts = [d for d in (_rows(tables, s) for s in (SWEEP, LONG)) if _drawn(d)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["sweep"])


def _by_label(df: pd.DataFrame):
    rank = {s: i for i, s in enumerate(ORDER)}
    return sorted(df.groupby("label"), key=lambda kv: rank.get(kv[1]["system"].iloc[0], 99))


def _record(d: pd.DataFrame, x: str, metric: str, column: str, unit: str,
            spread: tuple[str, str] | None = None) -> list[dict]:
    """CSV rows of ``d``: the value where the cell is ok, else empty with its status; with
    ``spread``, the (low, high) columns of the value over the cell's repeats too."""
    rows = []
    for r in d.sort_values(x).to_dict("records"):
        ok = r["status"] == "ok"
        row = {"label": r["label"], "system": r["system"], "source": r["source"],
               "world": r["world"], "seq_len": r["seq_len"], "metric": metric,
               "value": r[column] if ok else None, "unit": unit, "status": r["status"]}
        if spread:
            row.update(low=r[spread[0]] if ok else None, high=r[spread[1]] if ok else None)
        rows.append(row)
    return rows


def _bytes_panel(ax, df: pd.DataFrame, x: str, styles: dict) -> list[dict]:
    rows = []
    for label, d in _by_label(df):
        st = styles[label]
        sim = d[(d["source"] == "simulated") & (d["status"] == "ok")].sort_values(x)
        mea = d[d["source"] == "measured"]
        ok = mea[mea["status"] == "ok"]
        ax.plot(sim[x], sim["bytes"] / 2**20, color=st["color"], lw=st["lw"], ls=st["ls"],
                label=label)
        ax.scatter(ok[x], ok["bytes"] / 2**20, color=st["color"], edgecolor="black",
                   marker=st["marker"], s=st["s"], lw=0.6, zorder=5)
        mark_failures(ax, mea, x, FLOOR, st["color"], "bytes")
        rows += _record(d[d["source"] == "simulated"], x, "bytes_sent", "bytes", "bytes")
        rows += _record(mea, x, "bytes_sent", "bytes", "bytes")
    ax.set_xscale("log", base=2)
    ax.set_ylabel("MiB sent per rank (fwd + bwd)")
    _legend(ax, styles, [label for label, _ in _by_label(df)])
    _note_coinciding(ax, df, x, "bytes")
    return rows


def _legend(ax, styles: dict, labels: list[str]) -> None:
    """One entry per method: its line style and marker together."""
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], color=styles[lab]["color"], ls=styles[lab]["ls"],
                              lw=1.4, marker=styles[lab]["marker"], ms=5,
                              markeredgecolor="black", markeredgewidth=0.5, label=lab)
                       for lab in labels], fontsize=6, loc="lower right",
              bbox_to_anchor=(1.0, FLOOR + 0.05))  # above the marks at the floor


def _baseline(ok: pd.DataFrame) -> str | None:
    """The sweep spec's baseline where it has a number, else ring, else the first label;
    None where no cell has one."""
    specs = ok["sweep_spec"].dropna() if "sweep_spec" in ok else []
    named = json.loads(specs.iloc[0]).get("baseline") if len(specs) else None
    for label in (named, "ring"):
        if label and (ok["label"] == label).any():
            return label
    return ok["label"].iloc[0] if len(ok) else None


def _int_ticks(ax, ticks, fmt=str) -> None:
    ax.set_xticks(list(ticks), [fmt(t) for t in ticks])
    ax.minorticks_off()


def _scaling(axes, df: pd.DataFrame, styles: dict) -> list[dict]:
    n = int(df[df["source"] == "measured"]["seq_len"].max())
    df = df[df["seq_len"] == n]
    rows = _bytes_panel(axes[0], df, "world", styles)
    axes[0].set_xlabel("ranks")
    axes[0].set_title(f"{SWEEP}: bytes per rank at {n} tokens: formula (lines), counted "
                      "(markers)", fontsize=8)
    ax = axes[1]
    mea = df[df["source"] == "measured"]
    ok = mea[mea["status"] == "ok"]
    base_label = _baseline(ok)
    base = ok[ok["label"] == base_label].set_index("world")["time_s"]
    for label, d in _by_label(mea):
        st = styles[label]
        # the spread of a cell's repeats (its fastest and slowest), over the baseline's median
        d = d.assign(speedup=d["world"].map(base) / d["time_s"],
                     speedup_low=d["world"].map(base) / d.get("time_s_max", float("nan")),
                     speedup_high=d["world"].map(base) / d.get("time_s_min", float("nan")))
        # a cell that ran where the baseline did not has no speedup: said, not left blank
        d.loc[(d["status"] == "ok") & d["speedup"].isna(), "status"] = "no baseline"
        good = d[d["status"] == "ok"].sort_values("world")
        ax.plot(good["world"], good["speedup"], marker=st["marker"], ms=4, ls=st["ls"],
                color=st["color"], label=label)
        ax.vlines(good["world"], good["speedup_low"], good["speedup_high"], color=st["color"],
                  lw=1.2)
        mark_failures(ax, d, "world", FLOOR, st["color"], "speedup")
        rows += _record(d, "world", f"speedup_vs_{base_label or 'none'}", "speedup", "x",
                        spread=("speedup_low", "speedup_high"))
    ax.axhline(1.0, color="black", lw=0.7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel(f"measured speedup over {base_label or 'a baseline'}")
    gaps = sorted(set(mea["world"]) - set(base.index))
    if base_label is None:
        note_empty(ax, "no measured cell ran: no speedup")
    elif gaps:
        ax.text(0.98, 0.98, f"no speedup at {', '.join(str(int(w)) for w in gaps)} ranks: "
                f"{base_label} has no time there", transform=ax.transAxes, ha="right",
                va="top", fontsize=6, color="0.2")
    ax.set_title(f"CPU (gloo) time per layer at {n} tokens: overheads, not GPU speed\n(bars: "
                 "its fastest to its slowest repeat)", fontsize=8)
    for a in axes:  # ranks as plain numbers: 2, 4, 8
        _int_ticks(a, sorted(int(w) for w in df["world"].unique()))
    return rows


def _long(axes, df: pd.DataFrame, styles: dict) -> list[dict]:
    rows = _bytes_panel(axes[0], df, "seq_len", styles)
    ticks = sorted(df["seq_len"].unique())
    world = int(df["world"].max())
    axes[0].set_xlabel(f"tokens ({world} ranks)")
    axes[0].set_title(f"{LONG}: bytes per rank, sliding window", fontsize=8)
    ax = axes[1]
    mea = df[df["source"] == "measured"]
    for label, d in _by_label(mea):
        st = styles[label]
        good = d[d["status"] == "ok"].sort_values("seq_len")
        ax.plot(good["seq_len"], good["mem_peak_bytes"] / GIB, marker=st["marker"],
                ms=max(3.0, st["s"] ** 0.5), ls=st["ls"], lw=st["lw"], color=st["color"],
                markeredgecolor="black", markeredgewidth=0.5, label=label)
        mark_failures(ax, d, "seq_len", FLOOR, st["color"], "mem_peak_bytes")
        rows += _record(d, "seq_len", "mem_peak", "mem_peak_bytes", "bytes")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"tokens ({world} ranks)")
    ax.set_ylabel("measured peak memory per rank (GiB)")
    ax.set_title(f"{LONG}: transient peak per rank (CPU allocator)", fontsize=8)
    _legend(ax, styles, [label for label, _ in _by_label(mea)])
    _note_coinciding(ax, mea, "seq_len", "mem_peak_bytes")
    for a in axes:
        _int_ticks(a, ticks, seq_label)
    return rows


def make(tables):
    fig, axes = new_figure(2, 2, width=4.4, height=3.4)
    rows = []
    frames = {sweep: _rows(tables, sweep) for sweep in (SWEEP, LONG)}
    # one style per method across all four panels
    every = pd.concat([d for d in frames.values() if len(d)] or [pd.DataFrame(
        columns=["label", "system"])], ignore_index=True)
    styles = series_styles([(lab, d["system"].iloc[0]) for lab, d in _by_label(every)])
    for ax_row, sweep, draw in ((axes[0], SWEEP, _scaling), (axes[1], LONG, _long)):
        df = frames[sweep]
        if not _drawn(df):
            for ax in ax_row:
                note_empty(ax, f"no measured CPU sweep {sweep} in\n{wrap_path(tables.where())} "
                               f"yet\n(burst-bench run {sweep})")
            continue
        rows += [dict(r, sweep=sweep) for r in draw(ax_row, df, styles)]
    fig.suptitle("Measured on local CPU ranks (gloo), next to the simulator's byte formula (at "
                 "the floor: \u00d7 out of memory, \u25cb cannot run, \u25b3 error, \u25bd "
                 "timeout, * ran, no number)", fontsize=10)
    fig.tight_layout()
    return fig, pd.DataFrame(rows)
