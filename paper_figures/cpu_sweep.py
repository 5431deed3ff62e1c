"""Measured on local CPU ranks (the harness's CPU sweeps, gloo), next to the simulator: bytes
sent per rank per attention layer (measured by the byte counter: markers; the simulator's
formula for the same cells: lines) and the measured speedup over the sweep's baseline."""

from __future__ import annotations

import pandas as pd

from paper_figures.common import new_figure, note_empty
from paper_figures.palette import ORDER, SOURCE_MARKERS, color

NAME = "cpu_sweep"
SWEEP = "cpu_scaling"
HARDWARE = "a800"  # the profile the simulated lines come from


def _rows(tables) -> pd.DataFrame:
    parts = []
    for src, df in (("measured", tables.measured), ("simulated", tables.simulated)):
        if df is None or not len(df):
            continue
        d = df[(df["sweep"] == SWEEP) & (df["workload"] == "attention")].copy()
        if src == "simulated":  # bytes do not depend on the profile: one line per label
            d = d[d["hardware"] == HARDWARE]
        d["source"] = src
        parts.append(d)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def make(tables):
    df = _rows(tables)
    fig, axes = new_figure(2, 1, width=4.4, height=3.4)
    if not len(df) or not (df["source"] == "measured").any():
        for ax in axes[0]:
            note_empty(ax, "no measured CPU sweep in results/ yet\n(burst-bench run cpu_scaling)")
        return fig, pd.DataFrame()
    n = int(df[df["source"] == "measured"]["seq_len"].max())
    df = df[df["seq_len"] == n].copy()
    # a row without a byte count is missing, not zero (results/README.md)
    df["bytes"] = df["bytes_sent_forward"] + df["bytes_sent_backward"]
    rank = {s: i for i, s in enumerate(ORDER)}
    rows = []
    ax = axes[0][0]
    for label, d in sorted(df.groupby("label"), key=lambda kv: rank.get(kv[1]["system"].iloc[0],
                                                                        99)):
        system = d["system"].iloc[0]
        sim = d[(d["source"] == "simulated") & (d["status"] == "ok")].sort_values("world")
        mea = d[(d["source"] == "measured") & (d["status"] == "ok")].sort_values("world")
        ax.plot(sim["world"], sim["bytes"] / 2**20, color=color(label), lw=1.4, label=label)
        ax.scatter(mea["world"], mea["bytes"] / 2**20, color=color(label), edgecolor="black",
                   marker=SOURCE_MARKERS["measured"], s=26, zorder=5)
        rows += [{"label": label, "system": system, "source": r["source"], "world": r["world"],
                  "seq_len": n, "metric": "bytes_sent", "value": r["bytes"],
                  "unit": "bytes"}
                 for r in pd.concat([sim, mea]).to_dict("records")]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("MiB sent per rank (fwd + bwd)")
    ax.set_title(f"bytes per rank at {n} tokens: formula (lines), counted (\u25a0)", fontsize=8)
    ax.legend(fontsize=6)
    ax = axes[0][1]
    mea = df[(df["source"] == "measured") & (df["status"] == "ok")]
    base_label = "ring" if (mea["label"] == "ring").any() else mea["label"].iloc[0]
    base = mea[mea["label"] == base_label].set_index("world")["time_s"]
    for label, d in mea.groupby("label"):
        d = d.sort_values("world")
        sp = [base.get(w, float("nan")) / t for w, t in zip(d["world"], d["time_s"],
                                                            strict=True)]
        ax.plot(d["world"], sp, marker="s", ms=4, color=color(label), label=label)
        rows += [{"label": label, "system": d["system"].iloc[0], "source": "measured",
                  "world": w, "seq_len": n, "metric": f"speedup_vs_{base_label}",
                  "value": s, "unit": "x"}
                 for w, s in zip(d["world"], sp, strict=True)]
    ax.axhline(1.0, color="black", lw=0.7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel(f"measured speedup over {base_label}")
    ax.set_title("CPU (gloo) time per layer: overheads, not GPU speed", fontsize=8)
    fig.tight_layout()
    return fig, pd.DataFrame(rows)
