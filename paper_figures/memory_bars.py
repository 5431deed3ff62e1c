"""Memory per GPU (max_memory_reserved, GiB) of the main runs: simulated bars (predicted peak,
also for cells predicted OOM, faded; drawn up to twice the capacity, the CSV has the whole
value), published diamonds, the simulator's OOM threshold (the A800 profile's usable memory) as
a line. Published memory is the paper's max_memory_reserved, its "GB" read as GiB."""

from __future__ import annotations

import pandas as pd

from paper_figures._bars import (
    bar_legend,
    footnote,
    label_order,
    panel_bars,
    panel_rows,
    rows_for,
    status_note,
)
from paper_figures.common import new_figure, note_empty, seq_label
from suites.hardware import GIB, load

NAME = "memory_bars"
SWEEPS = ("paper_main_7b", "paper_main_14b")  # suites/specs: the main table
PANELS = (("7b", 32), ("7b", 64), ("14b", 32), ("14b", 64))
YMAX_GIB = 160.0  # about twice an A800's memory: predicted peaks above it are clipped


def drawn_rows(tables) -> pd.DataFrame:
    """The rows of ``SWEEPS`` the figure draws: those of main_throughput's panels."""
    from paper_figures import main_throughput

    return main_throughput.drawn_rows(tables)


def make(tables):
    df = rows_for(tables, "train_step")
    df = df[df["sweep"].isin(SWEEPS) | (df["source"] == "paper")].copy()
    # a predicted OOM still has a predicted peak: draw it (clipped) so the excess shows
    sim_oom = (df["source"] == "simulated") & (df["status"] == "oom")
    df.loc[sim_oom, "status"] = "ok"
    df["mem_gib"] = df["mem_reserved_bytes"] / GIB
    hw = load("a800")
    usable = hw.usable_gib  # a predicted peak above it is an oom row
    fig, axes = new_figure(len(PANELS), 1, width=3.6, height=3.6)
    plotted = []
    for j, (model, world) in enumerate(PANELS):
        ax = axes[0][j]
        sub = panel_rows(df, model, world)
        if not len(sub):
            note_empty(ax)
            continue
        predicted_oom = frozenset(sub.loc[sim_oom.loc[sub.index], "label"])
        d = panel_bars(ax, sub, "mem_gib", label_order(sub), clip=YMAX_GIB,
                       drawn_oom=predicted_oom)
        d.loc[(d["source"] == "simulated") & d["label"].isin(predicted_oom), "status"] = "oom"
        d["model"], d["world"], d["seq_len"] = model, world, int(sub["seq_len"].iloc[0])
        d["metric"], d["unit"] = "mem_reserved_gib", "GiB"
        plotted.append(d)
        ax.axhline(usable, color="black", lw=0.8, ls="--")
        # room for the tallest bar or diamond, not an empty third of the panel
        top = max([usable, *d["value"].dropna().clip(upper=YMAX_GIB)])
        ax.set_ylim(0, 1.12 * top)
        ax.set_title(f"{model.upper()}, {world} GPUs, {seq_label(sub['seq_len'].iloc[0])}",
                     fontsize=9)
        ax.set_ylabel("memory per GPU (GiB)" if j == 0 else "")
    measured = any((d["source"] == "measured").any() for d in plotted)
    fig.suptitle(f"Memory per GPU: simulated peak (bars; above the dashed line, the {usable:g} "
                 f"GiB usable of the {hw.memory_gib:g} CUDA sees, = OOM), published (\u25c6)"
                 + (", measured on GPUs (\u25a1)" if measured else "")
                 + "; published: the paper's max_memory_reserved, its GB read as GiB (see "
                 "below)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    bar_legend(fig, measured, faded=True, loc="upper center", bbox_to_anchor=(0.5, 0.945),
               ncol=4)
    footnote(fig, "; ".join(filter(None, [
        status_note(pd.concat([panel_rows(df, m, w) for m, w in PANELS]), mfu=False),
        "published memory: the paper's max_memory_reserved, in GB by its column name, read as "
        "GiB, which is confirmed for BurstEngine's rows only and assumed for the others "
        "(results/paper_reference/README.md; as decimal GB they would be 6.9% lower)"])),
             width=250, fontsize=8)
    return fig, pd.concat(plotted, ignore_index=True) if plotted else pd.DataFrame()
