"""Shared drawing for the bar figures: simulated bars, published and measured markers, OOM."""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from paper_figures.palette import ORDER, SOURCE_MARKERS, color

__all__ = ["label_order", "panel_bars", "rows_for"]

KEEP = ["source", "workload", "model", "world", "seq_len", "label", "system", "checkpointing",
        "status", "hardware", "tokens_per_s", "mfu_model_flops_causal", "attn_tflops",
        "mem_reserved_bytes", "time_s", "sweep"]


def rows_for(tables, workload: str, hardware: str = "a800") -> pd.DataFrame:
    """Simulated (on ``hardware``), measured and published rows of a workload, one frame."""
    parts = []
    for src, df in (("simulated", tables.simulated), ("measured", tables.measured),
                    ("paper", tables.paper)):
        if df is None or not len(df):
            continue
        d = df[df["workload"] == workload].copy()
        if src == "simulated" and "hardware" in d:
            d = d[d["hardware"] == hardware]
        if src == "measured":
            d = d[d["device"] == "cuda"] if "device" in d else d.iloc[0:0]
        d["source"] = src
        parts.append(d.reindex(columns=KEEP))
    if not parts:
        return pd.DataFrame(columns=KEEP)
    return pd.concat(parts, ignore_index=True)


def label_order(df: pd.DataFrame) -> list[str]:
    """Labels by system (baselines first) then with selective before full checkpointing."""
    rank = {s: i for i, s in enumerate(ORDER)}
    seen = df.drop_duplicates("label")
    keys = sorted(seen.to_dict("records"), key=lambda r: (
        rank.get(r["system"], len(rank)), r.get("checkpointing") == "full", r["label"]))
    return [r["label"] for r in keys]


def panel_bars(ax, df: pd.DataFrame, metric: str, labels: list[str], *, scale: float = 1.0,
               oom_height: float | None = None) -> pd.DataFrame:
    """Simulated bars (hatched = w/o selective checkpointing), published / measured markers,
    'OOM' where a source says so. Returns the plotted values (one row per label x source)."""
    x = np.arange(len(labels))
    out = []
    sim = df[df["source"] == "simulated"].drop_duplicates("label", keep="last").set_index("label")
    heights, colors = [], []
    for lab in labels:
        r = sim.loc[lab] if lab in sim.index else None
        ok = r is not None and r["status"] == "ok" and pd.notna(r[metric])
        v = float(r[metric]) * scale if ok else 0.0
        heights.append(v)
        sys_ = r["system"] if r is not None else df[df["label"] == lab]["system"].iloc[0]
        colors.append(color(sys_))
        out.append({"label": lab, "system": sys_, "source": "simulated",
                    "status": None if r is None else r["status"], "value": v if ok else None})
    bars = sns.barplot(x=x, y=heights, hue=x, palette=colors, legend=False, ax=ax,
                       saturation=1.0)
    for lab, patch in zip(labels, bars.patches, strict=False):
        rows = df[(df["label"] == lab)]
        if (rows["checkpointing"] == "full").any():
            patch.set_hatch("//")
    ymax = max([h for h in heights if h] or [1.0])
    for src in ("paper", "measured"):
        d = df[df["source"] == src].drop_duplicates("label", keep="last").set_index("label")
        for i, lab in enumerate(labels):
            if lab not in d.index:
                continue
            r = d.loc[lab]
            if r["status"] == "ok" and pd.notna(r[metric]):
                v = float(r[metric]) * scale
                ax.scatter([i], [v], marker=SOURCE_MARKERS[src], s=28, zorder=5,
                           color="black" if src == "paper" else "white", edgecolor="black")
                ymax = max(ymax, v)
                out.append({"label": lab, "system": r["system"], "source": src,
                            "status": "ok", "value": v})
            elif r["status"] in ("oom", "missing", "skipped", "error"):
                out.append({"label": lab, "system": r["system"], "source": src,
                            "status": r["status"], "value": None})
    for i, (lab, h) in enumerate(zip(labels, heights, strict=True)):
        sim_status = out[i]["status"]
        paper = [o for o in out if o["label"] == lab and o["source"] == "paper"]
        tags = []
        if sim_status not in (None, "ok"):
            tags.append(f"sim {sim_status.upper()}")
        if paper and paper[0]["status"] not in ("ok", None):
            tags.append(f"paper {paper[0]['status'].upper()}")
        if tags and h and h > 0.5 * ymax:  # a tall bar holds its tags (no room above it)
            ax.text(i, 0.97 * h, "\n".join(tags), ha="center", va="top", fontsize=6,
                    rotation=90, color="white")
        elif tags:
            ax.text(i, h or oom_height or 0.02 * ymax, "\n".join(tags),
                    ha="center", va="bottom", fontsize=6, rotation=90, color="0.25")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    return pd.DataFrame(out)
