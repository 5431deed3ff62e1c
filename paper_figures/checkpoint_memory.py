"""Activations kept per GPU between forward and backward vs sequence length (32 GPUs), per
checkpointing mode: none, full (layer input only), selective (+ attention output and lse),
selective_half (half of that cache). One panel per model; dashed: the memory usable on an A800
(78.5 of the 79.33 GiB CUDA sees, the simulator's OOM line), against which these activations
alone are drawn (no weights, gradients or optimizer states). "full" is the paper's "w/o
sele-ckpt"; "none" keeps every activation (no recomputation)."""

from __future__ import annotations

import pandas as pd

from paper_figures.common import memory_axes, new_figure, note_empty
from paper_figures.palette import MODE_COLORS
from suites.hardware import GIB, load

NAME = "checkpoint_memory"
# what each mode keeps, in the legend ("none" and "full" read the other way round elsewhere)
MODE_NAMES = {"none": "none (every activation kept)",
              "full": "full (layer inputs; paper: w/o sele-ckpt)",
              "selective": "selective (+ attention output, lse)",
              "selective_half": "selective_half (half of that cache)"}
HW = load("a800")  # its usable memory: the simulator's OOM line, as memory_bars


def make(tables):
    b = tables.breakdowns
    df = b[b["kind"] == "checkpoint_memory"].copy() if len(b) else pd.DataFrame()
    models = list(dict.fromkeys(df["model"])) if len(df) else ["-"]
    fig, axes = new_figure(len(models), 1, width=4.0, height=3.4)
    if not len(df):
        note_empty(axes[0][0])
        return fig, pd.DataFrame()
    df["GiB"] = df["value"] / GIB
    for j, model in enumerate(models):
        ax = axes[0][j]
        rows = df[df["model"] == model]
        for mode, d in rows.groupby("series", sort=False):
            ax.plot(d["seq_len"], d["GiB"], marker="o", ms=3, color=MODE_COLORS.get(mode, "0.5"),
                    label=MODE_NAMES.get(mode, mode))
        memory_axes(ax, HW, rows["world"],
                    "checkpointed activations per GPU (GiB)" if j == 0 else "")
        ax.set_title(f"{model.upper()}: activations alone (no model states)", fontsize=9)
    # one legend under the panels: inside, "upper left" covered "none" crossing the usable
    # line, and no corner of the panels is free of lines
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    return fig, df
