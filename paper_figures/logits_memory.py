"""LM head + loss peak per GPU vs sequence length (32 GPUs): the plain head materialises the
local N/G x V logits in fp32, the fused head one chunk of them, each with the head's gathered
weight and its gradient; the fused head's fp32 weight-gradient accumulator (V x E x 4 B) is
why it holds more than the plain head at short local sequences (suites.memory_model). 14B's
vocabulary is 120000 (BurstEngine's), 7B's 32000."""

from __future__ import annotations

import pandas as pd

from burst.engine.configs import get_config
from burst.engine.fused_loss import LOSS_CHUNK
from paper_figures.common import legend, memory_axes, new_figure, note_empty
from paper_figures.palette import MODEL_COLORS
from suites.hardware import GIB, load
from suites.implementations import Implementation

NAME = "logits_memory"
HW = load("a800")  # its usable memory: the simulator's OOM line, as memory_bars


def make(tables):
    b = tables.breakdowns
    df = b[b["kind"] == "logits_memory"].copy() if len(b) else pd.DataFrame()
    fig, axes = new_figure(1, 1, width=6.6, height=3.4)
    ax = axes[0][0]
    if not len(df):
        note_empty(ax)
        return fig, pd.DataFrame()
    df["GiB"] = df["value"] / GIB
    for (model, series), d in df.groupby(["model", "series"], sort=False):
        ax.plot(d["seq_len"], d["GiB"], "-" if series == "plain head" else ":", marker="o",
                ms=3, color=MODEL_COLORS.get(model, "0.4"), label=f"{model.upper()} {series}")
    memory_axes(ax, HW, df["world"], "LM head + loss peak per GPU (GiB)")
    # the counting rule the crossover depends on (suites.memory_model.head_bytes)
    vocab = ", ".join(f"{m.upper()} V = {get_config(m).vocab_size}"
                      for m in dict.fromkeys(df["model"]))
    ax.set_title(f"LM head + loss ({vocab})\nplain: N/G x V logits at "
                 f"{Implementation.logits_bytes:g} B (fp32 + fp32 grad); fused: one chunk of "
                 f"{LOSS_CHUNK} tokens + an fp32 V x E weight gradient; both: the head's weight "
                 "and gradient", fontsize=7)
    legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the lines
    fig.tight_layout()
    return fig, df
