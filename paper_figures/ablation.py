"""Incremental ablation: BurstEngine's options added one at a time (the ablation sweep's model
and GPUs: 14B, 32): tokens/s per GPU and memory per GPU at each of its sequence lengths; a
step that did not run is a labelled gap, and speedups are against the first step that ran."""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from paper_figures._bars import rows_for
from paper_figures.common import new_figure, note_empty, seq_label

NAME = "ablation"
SWEEP = "paper_ablation"
GIB = 2**30


def make(tables):
    df = rows_for(tables, "train_step")
    df = df[df["sweep"] == SWEEP].copy()
    lens = sorted(df["seq_len"].unique()) if len(df) else []
    fig, axes = new_figure(max(1, len(lens)), 2, width=4.0, height=3.0)
    if not len(df):
        for ax in axes.flat:
            note_empty(ax)
        return fig, pd.DataFrame()
    df["mem_gib"] = df["mem_reserved_bytes"] / GIB
    steps = list(dict.fromkeys(df.sort_index()["label"]))  # the spec's order
    colors = dict(zip(steps, sns.color_palette("Reds", len(steps) + 1)[1:], strict=True))
    rows = []
    for j, n in enumerate(lens):
        sub = df[(df["seq_len"] == n) & (df["source"] == "simulated")]
        if not len(sub):
            for i in range(2):
                note_empty(axes[i][j])
            continue
        where = f"{str(sub['model'].iloc[0]).upper()}, {int(sub['world'].iloc[0])} GPUs"
        sub = sub.drop_duplicates("label", keep="last").set_index("label").reindex(steps)
        status = sub["status"].fillna("missing").tolist()
        for i, (metric, ylabel) in enumerate((("tokens_per_s", "tokens/s per GPU"),
                                              ("mem_gib", "memory per GPU (GiB)"))):
            ax = axes[i][j]
            vals = [v if st == "ok" else float("nan") for v, st in zip(sub[metric], status,
                                                                      strict=True)]
            why = ["no value" if st == "ok" else st for st in status]  # where vals is NaN
            sns.barplot(x=steps, y=[0.0 if pd.isna(v) else v for v in vals], hue=steps,
                        palette=colors, legend=False, ax=ax, saturation=1.0)
            base = next((v for v in vals if not pd.isna(v)), None)  # the first step that ran
            for k, (v, st) in enumerate(zip(vals, why, strict=True)):
                if pd.isna(v):
                    ax.text(k, 0, st.upper(), ha="center", va="bottom", fontsize=6,
                            rotation=90, color="0.25")
                elif metric == "tokens_per_s":
                    ax.text(k, v, f"{v / base:.2f}x", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(steps)), steps if i == 1 else [""] * len(steps),
                          rotation=50, ha="right", fontsize=7)
            ax.set_ylabel(ylabel if j == 0 else "")
            if i == 0:
                ax.set_title(f"{where}, {seq_label(n)} tokens", fontsize=9)
            rows += [{"seq_len": n, "step": s, "metric": metric,
                      "value": None if pd.isna(v) else v,
                      "status": st if pd.isna(v) else "ok"}
                     for s, v, st in zip(steps, vals, why, strict=True)]
    fig.suptitle("BurstEngine options added one at a time (simulated, A800)", fontsize=10)
    fig.tight_layout()
    return fig, pd.DataFrame(rows)
