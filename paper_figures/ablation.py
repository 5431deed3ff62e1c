"""Incremental ablation: BurstEngine's options added one at a time (the ablation sweep's model
and GPUs: 14B, 32): tokens/s per GPU and memory per GPU at each of its sequence lengths; a
step that did not run is a labelled gap, and speedups are against the first step that ran (in the
spec's order, kept; the CSV's ``speedup_over`` names it, and its bar says "(base)" when it is not
the first step). A step that also changes the layout without naming it says so in its
tick label (``step_labels``; the shipped spec's layout change is a step of its own)."""

from __future__ import annotations

import json

import pandas as pd
import seaborn as sns
from matplotlib.patches import Patch

from paper_figures._bars import label_checkpointing, rows_for
from paper_figures.common import new_figure, note_empty, seq_label
from paper_figures.palette import FULL_RECOMPUTE, FULL_RECOMPUTE_LABEL, hatch
from suites.hardware import GIB

NAME = "ablation"
SWEEP = "paper_ablation"
DRAWS = "the a800 simulation alone (measured rows are not drawn)"


def _layout(options) -> str | None:
    try:
        return json.loads(options or "{}").get("layout")
    except (TypeError, ValueError):
        return None


def step_labels(steps: list[str], options: list) -> list[str]:
    """The tick label of each step: its label, plus the layout where a step changes it
    silently (the label does not name it): '+ selective ckpt (half cache) + striped layout'."""
    out, before = [], None
    for step, opts in zip(steps, options, strict=True):
        layout = _layout(opts)
        if before and layout and layout != before and layout not in step:
            step = f"{step} + {layout} layout"
        out.append(step)
        before = layout or before
    return out


def speedup_base(values: list[float]) -> int | None:
    """The step speedups are over: the first that has a number (None if none has)."""
    return next((k for k, v in enumerate(values) if not pd.isna(v)), None)


def speedups(values: list[float]) -> list[float]:
    """Each step's tokens/s over ``speedup_base``'s (NaN where either has no number)."""
    k = speedup_base(values)
    return [float("nan") if k is None or pd.isna(v) else v / values[k] for v in values]


def _rows(tables) -> pd.DataFrame:
    df = rows_for(tables, "train_step")
    return df[df["sweep"] == SWEEP].copy()


def drawn_rows(tables) -> pd.DataFrame:
    """The rows of ``SWEEP`` the figure draws: the A800 simulation's (measured rows are not
    drawn)."""
    df = _rows(tables)
    return df[df["source"] == "simulated"]


def make(tables):
    df = _rows(tables)
    lens = sorted(df["seq_len"].unique()) if len(df) else []
    fig, axes = new_figure(max(1, len(lens)), 2, width=4.0, height=3.0)
    if not len(df):
        for ax in axes.flat:
            note_empty(ax)
        return fig, pd.DataFrame()
    df["mem_gib"] = df["mem_reserved_bytes"] / GIB
    steps = list(dict.fromkeys(df.sort_index()["label"]))  # the spec's order
    options = df.sort_index().drop_duplicates("label")["method_options"].tolist()
    ticks = step_labels(steps, options)
    colors = dict(zip(steps, sns.color_palette("Reds", len(steps) + 1)[1:], strict=True))
    # hatched as in every other figure: a step with full recomputation (the paper's "w/o
    # sele-ckpt")
    modes = {step: label_checkpointing(df, step) for step in steps}
    hatches = [hatch(modes[step]) for step in steps]
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
            bars = sns.barplot(x=steps, y=[0.0 if pd.isna(v) else v for v in vals], hue=steps,
                               palette=colors, legend=False, ax=ax, saturation=1.0)
            for patch, h in zip(bars.patches, hatches, strict=True):
                patch.set_hatch(h or None)
            ups = speedups(vals) if metric == "tokens_per_s" else [None] * len(vals)
            # named in the CSV; on the bars too when it is not the first step (that one failed)
            base = speedup_base(vals) if metric == "tokens_per_s" else None
            for k, (v, st, up) in enumerate(zip(vals, why, ups, strict=True)):
                if pd.isna(v):
                    ax.text(k, 0, st.upper(), ha="center", va="bottom", fontsize=6,
                            rotation=90, color="0.25")
                elif up is not None:
                    ax.text(k, v, f"{up:.2f}x" + (" (base)" if k == base != 0 else ""),
                            ha="center", va="bottom", fontsize=7)
            top = max([v for v in vals if not pd.isna(v)] or [1.0])
            ax.set_ylim(0, 1.15 * top)  # room for the labels above the tallest bar
            ax.set_xticks(range(len(steps)), ticks if i == 1 else [""] * len(steps),
                          rotation=50, ha="right", fontsize=7)
            ax.set_ylabel(ylabel if j == 0 else "")
            if i == 0:
                ax.set_title(f"{where}, {seq_label(n)} tokens", fontsize=9)
            rows += [{"model": sub["model"].dropna().iloc[0], "world": int(sub["world"].max()),
                      "seq_len": n, "label": s, "step": tick, "metric": metric,
                      "checkpointing": modes[s],
                      "value": None if pd.isna(v) else v,
                      "status": st if pd.isna(v) else "ok",
                      "speedup": None if up is None or pd.isna(up) else up,
                      "speedup_over": None if up is None or pd.isna(up) else ticks[base]}
                     for s, tick, v, st, up in zip(steps, ticks, vals, why, ups, strict=True)]
    fig.suptitle("BurstEngine options added one at a time (simulated, A800; the paper publishes no "
                 "ablation numbers).\nThe fused head is priced at the plain head's FLOPs and "
                 "traffic: its step changes memory alone. Every step sends its accumulators in "
                 "fp32,\nso the steps differ in one option each (the main figure's Burst-Ring "
                 "sends them in bf16, as the paper's system does)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))  # (the suptitle has its own room)
    if hatch(FULL_RECOMPUTE) in hatches:  # what the hatching means, under the title
        fig.legend(handles=[Patch(facecolor="white", edgecolor="0.3", hatch=hatch(FULL_RECOMPUTE),
                                  label=FULL_RECOMPUTE_LABEL)], loc="upper center",
                   bbox_to_anchor=(0.5, 0.9), fontsize=7, frameon=False)
    return fig, pd.DataFrame(rows)
