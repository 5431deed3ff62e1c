"""Shared drawing for the bar figures: simulated bars, published and measured markers, OOM."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from paper_figures.palette import (
    FULL_RECOMPUTE,
    FULL_RECOMPUTE_LABEL,
    ORDER,
    SOURCE_MARKERS,
    hatch,
    linestyle,
    series_color,
)

__all__ = ["FAILED_MARKERS", "FAILED_WORDS", "bar_legend", "label_checkpointing", "label_order",
           "line_labels", "failure_note", "footnote", "mark_failures", "panel_bars", "panel_rows",
           "rows_for", "model_notes", "status_note", "status_of"]

FADED = 0.35  # the alpha of a bar drawn for a cell predicted OOM

# where a line has no number: out of memory, every other way a cell can fail, and a cell that
# ran without this number ("no value": e.g. MFU on a GPU whose peak no profile gives)
FAILED_MARKERS = {"oom": "x", "skipped": "o", "error": "^", "timeout": "v", "missing": "s",
                  "no value": "*"}
FAILED_WORDS = {"oom": "OOM", "skipped": "cannot run", "error": "error", "timeout": "timeout",
                "missing": "missing", "no value": "no number"}

KEEP = ["source", "workload", "model", "world", "seq_len", "label", "system", "checkpointing",
        "status", "hardware", "tokens_per_s", "mfu_model_flops_causal", "attn_tflops",
        "mem_reserved_bytes", "time_s", "sweep", "method_options", "heads", "head_dim", "dtype",
        "causal", "error"]


def _on(d: pd.DataFrame, hardware: str) -> pd.Series:
    """Rows measured on ``hardware`` (a profile name, e.g. a800, in the device's name)."""
    names = d.get("hardware", pd.Series("", index=d.index)).fillna("").astype(str)
    return names.str.lower().str.contains(hardware.lower(), regex=False)


def rows_for(tables, workload: str, hardware: str = "a800") -> pd.DataFrame:
    """Simulated (on ``hardware``), measured (on GPUs of that kind: numbers from another GPU
    are not comparable with the published ones) and published rows of a workload."""
    parts = []
    for src, df in (("simulated", tables.simulated), ("measured", tables.measured),
                    ("paper", tables.paper)):
        if df is None or not len(df):
            continue
        d = df[df["workload"] == workload].copy()
        if src == "simulated" and "hardware" in d:
            d = d[d["hardware"] == hardware]
        if src == "measured":
            d = d[(d["device"] == "cuda") & _on(d, hardware)] if "device" in d else d.iloc[0:0]
        d["source"] = src
        parts.append(d.reindex(columns=KEEP))
    if not parts:
        return pd.DataFrame(columns=KEEP)
    return pd.concat(parts, ignore_index=True)


def panel_rows(df: pd.DataFrame, model: str, world: int) -> pd.DataFrame:
    """The rows of one (model, GPUs) panel at its one sequence length: the published one, else
    the longest of any source (a sweep with more lengths must not put two cells in a bar)."""
    sub = df[(df["model"] == model) & (df["world"] == world)]
    if not len(sub):
        return sub
    paper = sub[sub["source"] == "paper"]
    seq = (paper if len(paper) else sub)["seq_len"].max()
    return sub[sub["seq_len"] == seq]


def mark_failures(ax, rows: pd.DataFrame, x: str, y: float, colour: str, metric: str,
                  size: float = 30):
    """Cells of a line without a ``metric`` number, marked by status (``status_of``) at height
    ``y`` (axes fraction: a log axis has no 0) below the line's x positions, each with its
    status in words beside it: on an axis that does not start at 0 a bare mark read as a value
    (an audit read cpu_sweep's skipped Ulysses as "0.57x over ring"). The word goes left of a
    mark at the line's last x, where the axes end."""
    status = rows.apply(lambda r: status_of(r, metric), axis=1) if len(rows) else rows["status"]
    last = rows[x].max() if len(rows) else None
    for st, marker in FAILED_MARKERS.items():
        bad = rows[status == st]
        if len(bad):
            ax.scatter(bad[x], np.full(len(bad), y), marker=marker, s=size, color=colour,
                       facecolors=colour if marker in "x+*" else "none", clip_on=False,
                       transform=ax.get_xaxis_transform())
            for at in bad[x]:
                left = at == last and at != rows[x].min()
                ax.annotate(FAILED_WORDS[st], (at, y), xycoords=ax.get_xaxis_transform(),
                            xytext=(-5 if left else 5, 0), textcoords="offset points",
                            ha="right" if left else "left", va="center", fontsize=5.5,
                            color=colour, annotation_clip=False)


def label_checkpointing(df: pd.DataFrame, label: str):
    """A label's checkpointing mode as drawn: full if any of its rows is (so that a source
    that disagrees cannot hide full recomputation), else its first mode (None if none)."""
    d = df[df["label"] == label]
    modes = d["checkpointing"].dropna().tolist() if "checkpointing" in d else []
    return FULL_RECOMPUTE if FULL_RECOMPUTE in modes else (modes[0] if modes else None)


def line_labels(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(label, system, line style) per line, in ``label_order``: one line per label (two
    labels of one system share its colour; the one without selective checkpointing dashes:
    ``palette.linestyle``)."""
    return [(lab, df[df["label"] == lab]["system"].iloc[0],
             linestyle(label_checkpointing(df, lab))) for lab in label_order(df)]


def bar_legend(fig, measured: bool = False, faded: bool = False, **kw):
    """The legend of the bar figures: what the hatching means, and the markers (measured only
    when ``measured``: a figure without GPU rows does not promise them); ``faded``: what a
    faded bar is (a value drawn for a cell predicted OOM, ``panel_bars``' ``drawn_oom``)."""
    handles = [
        Patch(facecolor="white", edgecolor="0.3", hatch=hatch(FULL_RECOMPUTE),
              label=FULL_RECOMPUTE_LABEL),
        Line2D([], [], ls="none", marker=SOURCE_MARKERS["paper"], color="black", ms=5,
               label="published"),
    ]
    if faded:
        handles.append(Patch(facecolor="0.4", alpha=FADED, label="faded: predicted OOM"))
    if measured:
        handles.append(Line2D([], [], ls="none", marker=SOURCE_MARKERS["measured"],
                              color="white", markeredgecolor="black", ms=5,
                              label="measured on GPUs"))
    return fig.legend(handles=handles, fontsize=8, frameon=False, **kw)


def status_note(df: pd.DataFrame, mfu: bool = True) -> str:
    """A footnote for the tags a reader cannot guess: why cells were skipped (each distinct
    reason once: panels skip for different ones) and what a published MISSING is; empty where
    neither is drawn."""
    notes = []
    skipped = df[df["status"] == "skipped"]
    if len(skipped):
        why = " / ".join(dict.fromkeys(_why(e) for e in skipped["error"].dropna()))
        notes.append(f"SKIPPED ({', '.join(dict.fromkeys(skipped['label']))}): the system cannot "
                     "run the cell as configured" + (f": {why}" if why else ""))
    if ((df["source"] == "paper") & (df["status"] == "missing")).any():
        notes.append("paper MISSING: the paper's table has no number for the cell")
    notes += model_notes(df, mfu)
    return "; ".join(notes)


def model_notes(df: pd.DataFrame, mfu: bool = True) -> list[str]:
    """A clause per model that a drawn paper system built otherwise than the named config
    (``Implementation.gelu_mlp_models``: BurstEngine's 7B), for its simulated and published
    rows (a measured row is this project's engine, which builds the config); ``mfu``: the
    figure draws MFU, whose FLOPs the clause then names."""
    import dataclasses

    from burst.engine.configs import get_config, param_count
    from suites.implementations import implementations

    if "model" not in df:  # rows of attention layers alone
        return []
    impls = implementations()
    d = df[df["source"].isin(["simulated", "paper"]) & df["model"].notna()]
    notes = []
    for model in sorted(set(d["model"])):
        rows = d[d["model"] == model]
        labels = [lab for lab in label_order(rows) if any(
            model in impls[s].gelu_mlp_models
            for s in rows.loc[rows["label"] == lab, "system"] if s in impls)]
        if labels:
            cfg = get_config(model)
            gelu = param_count(dataclasses.replace(cfg, gated_mlp=False))
            notes.append(f"{', '.join(labels)} at {model.upper()}: the system's own config, a "
                         f"two-matrix GELU MLP ({gelu / 1e9:.2f}B parameters; the others "
                         f"SwiGLU, {param_count(cfg) / 1e9:.2f}B), priced as built"
                         + ("; its MFU counts the SwiGLU model's FLOPs, as the paper's does"
                            if mfu else ""))
    return notes


def footnote(fig, text: str, width: int = 170, fontsize: float = 7) -> None:
    """``text`` under the figure, wrapped at ``width`` characters (nothing if empty)."""
    if text:
        fig.text(0.5, 0.0, "\n".join(textwrap.wrap(text, width)), ha="center", va="top",
                 fontsize=fontsize)


def _why(error) -> str:
    """The first clause of a row's error: what a footnote quotes."""
    if pd.isna(error):
        return ""
    from suites.run import short_reason

    return short_reason(str(error).split("cannot run this case: ")[-1].split(";")[0], 90)


def failure_note(df: pd.DataFrame, x: str = "world", unit: str = "GPUs") -> str:
    """One clause per label and status of the simulated cells without a number, with the
    ``x`` values where they fail and the first one's reason (its row's error), in legend
    order: "Megatron: oom at 1, 2, 4 GPUs (at 1: predicted OOM: 144.98 GiB reserved > ...)"."""
    sim = df[(df["source"] == "simulated") & (df["status"] != "ok")]
    parts = []
    for label in label_order(sim) if len(sim) else []:
        d = sim[sim["label"] == label].sort_values(x)
        for status, g in d.groupby("status", sort=False):
            where = ", ".join(str(int(v)) for v in g[x])
            why = _why(g["error"].iloc[0])
            if why and len(g) > 1:  # the first cell's reason, its numbers not every cell's
                why = f"at {int(g[x].iloc[0])}: {why}"
            parts.append(f"{label}: {status} at {where} {unit}" + (f" ({why})" if why else ""))
    return "; ".join(parts)


def label_order(df: pd.DataFrame) -> list[str]:
    """Labels by system (baselines first) then with selective before full checkpointing."""
    rank = {s: i for i, s in enumerate(ORDER)}
    seen = df.drop_duplicates("label")
    keys = sorted(seen.to_dict("records"), key=lambda r: (
        rank.get(r["system"], len(rank)), r.get("checkpointing") == "full", r["label"]))
    return [r["label"] for r in keys]


def status_of(r, metric: str) -> str:
    """A row's status for this metric: an ok row without the value is 'no value', not 0."""
    st = str(r["status"])
    return "no value" if st == "ok" and pd.isna(r[metric]) else st


def panel_bars(ax, df: pd.DataFrame, metric: str, labels: list[str], *, scale: float = 1.0,
               oom_height: float | None = None, clip: float | None = None,
               drawn_oom: frozenset[str] = frozenset()) -> pd.DataFrame:
    """Simulated bars (colour: ``palette.series_color``; hatched: full recomputation,
    ``palette.hatch``), published / measured markers,
    the status (OOM, ERROR, TIMEOUT, ...) where a source has no number. Returns the plotted
    values, unclipped (one row per label x source); ``clip`` caps only the drawn height.
    ``drawn_oom``: labels whose simulated value is drawn although the cell is predicted OOM
    (a memory peak): faded, and tagged "sim OOM" like a bar without a number."""
    x = np.arange(len(labels))
    out = []
    sim = df[df["source"] == "simulated"].drop_duplicates("label", keep="last").set_index("label")
    heights, colors, hatches = [], [], []
    for lab in labels:
        r = sim.loc[lab] if lab in sim.index else None
        st = None if r is None else status_of(r, metric)
        v = float(r[metric]) * scale if st == "ok" else None
        heights.append(0.0 if v is None else v if clip is None else min(v, clip))
        sys_ = r["system"] if r is not None else df[df["label"] == lab]["system"].iloc[0]
        colors.append(series_color(sys_, lab))
        hatches.append(hatch(label_checkpointing(df, lab)))
        out.append({"label": lab, "system": sys_, "source": "simulated", "status": st,
                    "value": v})
    bars = sns.barplot(x=x, y=heights, hue=x, palette=colors, legend=False, ax=ax,
                       saturation=1.0)
    for patch, h, lab in zip(bars.patches, hatches, labels, strict=False):
        patch.set_hatch(h or None)
        if lab in drawn_oom:
            patch.set_alpha(FADED)
    ymax = max([h for h in heights if h] or [1.0])
    for src in ("paper", "measured"):
        d = df[df["source"] == src].drop_duplicates("label", keep="last").set_index("label")
        for i, lab in enumerate(labels):
            if lab not in d.index:
                continue
            r = d.loc[lab]
            st = status_of(r, metric)
            v = float(r[metric]) * scale if st == "ok" else None
            if v is not None:
                shown = v if clip is None else min(v, clip)
                ax.scatter([i], [shown], marker=SOURCE_MARKERS[src], s=28, zorder=5,
                           color="black" if src == "paper" else "white", edgecolor="black")
                ymax = max(ymax, shown)
            out.append({"label": lab, "system": r["system"], "source": src, "status": st,
                        "value": v})
    for i, (lab, h) in enumerate(zip(labels, heights, strict=True)):
        # a source without a number says why (a published row that gives no value for this
        # metric, e.g. memory, is only absent)
        tags = ["sim OOM"] if lab in drawn_oom else []
        tags += [f"{short} {o['status'].upper()}"
                 for src, short in (("simulated", "sim"), ("paper", "paper"), ("measured", "meas"))
                 for o in out if o["label"] == lab and o["source"] == src
                 if o["status"] not in (None, "ok") and (src == "simulated"
                                                          or o["status"] != "no value")]
        if tags and h and h > 0.5 * ymax:  # a tall bar holds its tags (no room above it),
            # dark: on a light box over a bar in full colour (and hatching), bare on a faded one
            box = None if lab in drawn_oom else dict(boxstyle="round,pad=0.15", fc="white",
                                                     ec="none", alpha=0.8)
            ax.text(i, 0.97 * h, "\n".join(tags), ha="center", va="top", fontsize=6,
                    rotation=90, color="0.1", bbox=box)
        elif tags:
            ax.text(i, h or oom_height or 0.02 * ymax, "\n".join(tags),
                    ha="center", va="bottom", fontsize=6, rotation=90, color="0.25")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    return pd.DataFrame(out)
