"""Weak scaling at 32K tokens per GPU, 1 -> 64 GPUs (7B training step): tokens/s per GPU and
MFU per method as the sequence grows with the machine. One line per label (dashed: without
selective checkpointing); cells without a number are marked at the floor by status."""

from __future__ import annotations

import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from paper_figures._bars import (
    failure_note,
    footnote,
    line_labels,
    mark_failures,
    model_notes,
    rows_for,
    status_of,
)
from paper_figures.common import MFU_LABEL, legend, new_figure, note_empty
from paper_figures.palette import SOURCE_MARKERS, series_color

NAME = "weak_scaling"
SWEEP = "paper_weak_scaling"
METRICS = (("tokens_per_s", "tokens/s per GPU"), ("mfu_model_flops_causal", MFU_LABEL))


def drawn_rows(tables) -> pd.DataFrame:
    """The rows of ``SWEEP`` the figure draws (simulated on the A800, measured on A800s)."""
    df = rows_for(tables, "train_step")
    return df[df["sweep"] == SWEEP]


def make(tables):
    df = drawn_rows(tables)
    fig, axes = new_figure(2, 1, width=4.4, height=3.4)
    if not len(df):
        for ax in axes[0]:
            note_empty(ax)
        return fig, pd.DataFrame()
    rows = []
    lines = line_labels(df)
    for j, (metric, ylabel) in enumerate(METRICS):
        ax = axes[0][j]
        scale = 100.0 if metric.startswith("mfu") else 1.0
        for k, (label, system, ls) in enumerate(lines):
            colour = series_color(system, label)
            d = df[df["label"] == label].sort_values("world", kind="stable")  # last row wins
            for src in ("simulated", "measured"):
                s = d[d["source"] == src].drop_duplicates("world", keep="last")
                ok = (s["status"] == "ok") & s[metric].notna()
                if ok.any():  # the line breaks where a cell has no number
                    ax.plot(s["world"], s[metric].where(ok) * scale, color=colour,
                            marker=SOURCE_MARKERS[src], ms=4,
                            ls=ls if src == "simulated" else "none",
                            label=label if src == "simulated" else None)
                elif src == "simulated":  # no number anywhere: in the legend all the same
                    ax.plot([], [], color=colour, marker=SOURCE_MARKERS[src], ms=4, ls=ls,
                            label=label)
                # cells without a number at the axis floor (axes coordinates: the log axis
                # has no 0), each line a little apart so that none hides another, measured
                # ones above all the simulated ones
                dy = 0.03 + 0.025 * (k + (len(lines) if src == "measured" else 0))
                mark_failures(ax, s, "world", dy, colour, metric, size=24)
                rows += [{"system": system, "label": label, "source": src,
                          "world": r["world"], "seq_len": r["seq_len"],
                          "status": status_of(r, metric),
                          "metric": metric, "value": r[metric] * scale if pd.notna(r[metric])
                          and r["status"] == "ok" else None,
                          "unit": "%" if scale == 100.0 else "tokens/s per GPU"}
                         for r in s.to_dict("records")]
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
        ax.set_xlabel("GPUs (32K tokens each)")
        ax.set_ylabel(ylabel)
        low = df.loc[(df["status"] == "ok"), metric].min()
        if pd.isna(low):  # every cell failed: its marks (which set no data limits) on a
            # plain y axis (a log one has no limits without a positive value)
            ax.set_xlim(df["world"].min() / 1.5, df["world"].max() * 1.5)
            note_empty(ax, "no cell has a number")
        elif metric == "tokens_per_s":
            ax.set_yscale("log")
            ax.set_ylim(bottom=low / 2.5)  # an empty band at the floor for the failure marks
            # 1, 2 and 5 of each decade labelled: a range of 72-1842 had only 100 and 1000
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(0, None)
    legend(axes[0][0], fontsize=7)
    measured = (df["source"] == "measured").any()
    fig.suptitle("Weak scaling, 7B, simulated on A800 nodes"
                 + (" (lines), measured on GPUs (\u25a0; their failures above the simulated "
                    "ones)" if measured else "")
                 + " (at the floor: \u00d7 out of memory, \u25cb cannot run, \u25b3 error, "
                 "\u25bd timeout, * ran, no number)", fontsize=10)
    fig.tight_layout()
    # why each mark at the floor is there, and which lines are another model
    footnote(fig, "; ".join(filter(None, [failure_note(df), *model_notes(df)])))
    return fig, pd.DataFrame(rows)
