"""Weak scaling at 32K tokens per GPU, 1 -> 64 GPUs (7B training step): tokens/s per GPU and
MFU per method as the sequence grows with the machine. Crosses: out of memory."""

from __future__ import annotations

import numpy as np
import pandas as pd

from paper_figures._bars import rows_for
from paper_figures.common import new_figure, note_empty
from paper_figures.palette import ORDER, SOURCE_MARKERS, color

NAME = "weak_scaling"
SWEEP = "paper_weak_scaling"
METRICS = (("tokens_per_s", "tokens/s per GPU"), ("mfu_model_flops_causal", "MFU %"))


def make(tables):
    df = rows_for(tables, "train_step")
    df = df[df["sweep"] == SWEEP]
    fig, axes = new_figure(2, 1, width=4.4, height=3.4)
    if not len(df):
        for ax in axes[0]:
            note_empty(ax)
        return fig, pd.DataFrame()
    rank = {s: i for i, s in enumerate(ORDER)}
    rows = []
    for j, (metric, ylabel) in enumerate(METRICS):
        ax = axes[0][j]
        scale = 100.0 if metric.startswith("mfu") else 1.0
        for system in sorted(df["system"].unique(), key=lambda s: rank.get(s, 99)):
            d = df[df["system"] == system].sort_values("world")
            for src in ("simulated", "measured"):
                s = d[d["source"] == src]
                ok = s[(s["status"] == "ok") & s[metric].notna()]
                if len(ok):
                    kw = dict(color=color(system), marker=SOURCE_MARKERS[src], ms=4)
                    ax.plot(ok["world"], ok[metric] * scale, lw=1.6 if src == "simulated"
                            else 0, label=d["label"].iloc[0] if src == "simulated" else None,
                            **kw)
                # failed cells at the axis floor (axes coordinates: the log axis has no 0),
                # each system a little apart so that none hides another
                dy = 0.03 + 0.025 * rank.get(system, 0)
                for status, marker in (("oom", "x"), ("skipped", "o")):
                    bad = s[s["status"] == status]
                    ax.scatter(bad["world"], np.full(len(bad), dy), marker=marker,
                               facecolors="none" if marker == "o" else color(system),
                               color=color(system), s=24, clip_on=False,
                               transform=ax.get_xaxis_transform())
                rows += [{"system": system, "label": r["label"], "source": src,
                          "world": r["world"], "seq_len": r["seq_len"], "status": r["status"],
                          "metric": metric, "value": r[metric] * scale if pd.notna(r[metric])
                          else None} for r in s.to_dict("records")]
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
        ax.set_xlabel("GPUs (32K tokens each)")
        ax.set_ylabel(ylabel)
        if metric == "tokens_per_s":
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, None)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Weak scaling, 7B, simulated on A800 nodes (\u00d7 = out of memory, "
                 "\u25cb = cannot run)", fontsize=10)
    fig.tight_layout()
    return fig, pd.DataFrame(rows)
