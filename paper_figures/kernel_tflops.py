"""Attention alone: TFLOP/s per GPU of one causal layer (forward + backward, flash-attention
convention) on 32 A800s at 128K-1M tokens. Lines: simulated; diamonds: published; squares:
measured on GPUs (if any); a cross at the bottom: out of memory."""

from __future__ import annotations

import numpy as np
import pandas as pd

from paper_figures._bars import rows_for
from paper_figures.common import fmt_tokens, new_figure, note_empty
from paper_figures.palette import ORDER, SOURCE_MARKERS, color

NAME = "kernel_tflops"
SWEEP = "paper_kernel_32gpu"  # suites/specs: the kernel table


def make(tables):
    df = rows_for(tables, "attention")
    df = df[(df["world"] == 32) & ((df["sweep"] == SWEEP) | (df["source"] == "paper"))]
    fig, axes = new_figure(1, 1, width=5.2, height=3.6)
    ax = axes[0][0]
    if not len(df):
        note_empty(ax)
        return fig, pd.DataFrame()
    rank = {s: i for i, s in enumerate(ORDER)}
    rows = []
    for system in sorted(df["system"].unique(), key=lambda s: rank.get(s, 99)):
        d = df[df["system"] == system].sort_values("seq_len")
        label = d["label"].iloc[0]
        for src in ("simulated", "paper", "measured"):
            s = d[d["source"] == src]
            ok = s[(s["status"] == "ok") & s["attn_tflops"].notna()]
            if src == "simulated" and len(ok):
                ax.plot(ok["seq_len"], ok["attn_tflops"], color=color(system), lw=1.8,
                        label=label)
            elif len(ok):
                ax.scatter(ok["seq_len"], ok["attn_tflops"], color=color(system), s=30,
                           marker=SOURCE_MARKERS[src], edgecolor="black", zorder=5)
            fail = s[s["status"] == "oom"]
            if len(fail):  # published OOM: x; predicted OOM: + (a little higher)
                ax.scatter(fail["seq_len"], np.full(len(fail), 0.04 if src == "paper" else 0.1),
                           marker="x" if src == "paper" else "+", color=color(system), s=36,
                           clip_on=False, transform=ax.get_xaxis_transform())
            rows += [{"system": system, "label": label, "source": src, "seq_len": r["seq_len"],
                      "status": r["status"], "attn_tflops": r["attn_tflops"]}
                     for r in s.to_dict("records")]
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(fmt_tokens)
    ax.set_xlabel("sequence length (tokens), 32 GPUs")
    ax.set_ylabel("attention TFLOP/s per GPU")
    ax.set_ylim(0, None)
    ax.legend(fontsize=7, loc="center right")
    ax.set_title("Attention forward+backward: simulated (lines; + = predicted OOM), "
                 "published (\u25c6; \u00d7 = OOM)", fontsize=9)
    fig.tight_layout()
    return fig, pd.DataFrame(rows)
