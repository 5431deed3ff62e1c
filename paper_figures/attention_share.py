"""Why long context is an attention problem: attention's share of a training step's FLOPs vs
sequence length (burst.flops; solid: causal pairs halved as in the paper's MFU, dashed: N^2)."""

from __future__ import annotations

import pandas as pd

from paper_figures.common import fmt_tokens, legend, new_figure, note_empty
from paper_figures.palette import MODEL_COLORS

NAME = "attention_share"
STYLE = {"model_flops_causal": "-", "model_flops_dense": "--"}


def make(tables):
    b = tables.breakdowns
    df = b[b["kind"] == "attention_share"] if len(b) else pd.DataFrame()
    fig, axes = new_figure(1, 1, width=4.6, height=3.4)
    ax = axes[0][0]
    if not len(df):
        note_empty(ax)
        return fig, pd.DataFrame()
    for (model, conv), d in df.groupby(["model", "series"], sort=False):
        ax.plot(d["seq_len"], 100 * d["value"], STYLE.get(conv, "-"),
                color=MODEL_COLORS.get(model, "0.4"),
                label=f"{model.upper()} ({'causal' if 'causal' in conv else 'dense'})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(fmt_tokens)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("attention share of FLOPs (%)")
    ax.set_ylim(0, 100)
    legend(ax, fontsize=7)
    fig.tight_layout()
    return fig, df
