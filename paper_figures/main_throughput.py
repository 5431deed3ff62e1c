"""Main result (BurstEngine paper): training tokens/s per GPU and MFU, 7B and 14B on 32 and 64
A800s. Bars: simulated (hatched: w/o sele-ckpt, full recomputation); black diamonds: published
(MFU: the published tokens/s under ``burst.flops``' model-FLOPs convention, as for every other
row); white squares: measured on GPUs, named in the title and legend only where there are any."""

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
from paper_figures.common import MFU_LABEL, new_figure, note_empty, seq_label

NAME = "main_throughput"
SWEEPS = ("paper_main_7b", "paper_main_14b")  # suites/specs: the main table
PANELS = (("7b", 32), ("7b", 64), ("14b", 32), ("14b", 64))
METRICS = (("tokens_per_s", "tokens/s per GPU", 1.0),
           ("mfu_model_flops_causal", MFU_LABEL, 100.0))
UNITS = {"tokens_per_s": "tokens/s per GPU", "mfu_model_flops_causal": "%"}  # of the CSV values


def _rows(tables) -> pd.DataFrame:
    df = rows_for(tables, "train_step")
    return df[df["sweep"].isin(SWEEPS) | (df["source"] == "paper")]


def drawn_rows(tables) -> pd.DataFrame:
    """The rows of ``SWEEPS`` the figure draws: its panels' (simulated on the A800, measured on
    A800s), at each panel's length."""
    df = _rows(tables)
    parts = [d for d in (panel_rows(df, model, world) for model, world in PANELS) if len(d)]
    df = pd.concat(parts, ignore_index=True) if parts else df.iloc[0:0]
    return df[df["source"] != "paper"]


def make(tables):
    df = _rows(tables)
    fig, axes = new_figure(len(PANELS), len(METRICS), width=3.6, height=3.4)
    plotted = []
    for j, (model, world) in enumerate(PANELS):
        sub = panel_rows(df, model, world)
        for i, (metric, ylabel, scale) in enumerate(METRICS):
            ax = axes[i][j]
            if not len(sub):
                note_empty(ax)
                continue
            d = panel_bars(ax, sub, metric, label_order(sub), scale=scale)
            d["model"], d["world"], d["seq_len"] = model, world, int(sub["seq_len"].iloc[0])
            d["metric"], d["unit"] = metric, UNITS[metric]
            plotted.append(d)
            seq = seq_label(sub["seq_len"].iloc[0])
            ax.set_title(f"{model.upper()}, {world} GPUs, {seq} tokens", fontsize=9)
            ax.set_ylabel(ylabel if j == 0 else "")
    measured = any((d["source"] == "measured").any() for d in plotted)
    fig.suptitle("Training throughput: simulated (bars), published (\u25c6)"
                 + (", measured on GPUs (\u25a1)" if measured else "")
                 + "; the published MFU is their tokens/s under burst.flops' convention "
                 "(the paper's own MFU is not in the reference tables)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    bar_legend(fig, measured, loc="upper center", bbox_to_anchor=(0.5, 0.955),
               ncol=3)
    footnote(fig, status_note(pd.concat([panel_rows(df, m, w) for m, w in PANELS])),
             width=250, fontsize=8)
    return fig, pd.concat(plotted, ignore_index=True) if plotted else pd.DataFrame()
