"""Attention alone: TFLOP/s per GPU of one causal layer (forward + backward, flash-attention
convention: backward = 2.5 x forward, causal pairs halved; the shape, from the rows, in the title)
on 32 A800s at 128K-1M tokens. Lines: simulated; diamonds: published; squares:
measured on GPUs (if any); at the bottom, a mark per cell without a number (x: out of memory;
the other failures have their own marks, ``_bars.FAILED_MARKERS``); a simulated number where
the paper reports OOM is ringed in its method's colour, over every other mark (open: the
published diamonds at the same height stay visible inside it), and its segment dotted (the
simulator's attention-only memory fits there: docs/simulator.md). The ring was black, and drawn
under the other marks: it lay around other methods' diamonds, and an audit read it as theirs
(Megatron-CP's 175.3 at 512K lies under BurstAttention's 177.5 and the published 174.5 and
178.6); a filled dot on top then hid those diamonds (a review)."""

from __future__ import annotations

import pandas as pd

from burst.flops import BACKWARD_OVER_FORWARD
from paper_figures._bars import FAILED_MARKERS, line_labels, mark_failures, rows_for, status_of
from paper_figures.common import fmt_tokens, legend, new_figure, note_empty
from paper_figures.palette import SOURCE_MARKERS, series_color

NAME = "kernel_tflops"
SWEEP = "paper_kernel_32gpu"  # suites/specs: the kernel table


DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
OOM_RING = 90  # marker area of the ring around a simulated number where the paper has OOM


def _one(values, fmt=str) -> str:
    """The one value of a column as text; several joined with '/' (never silently one)."""
    vals = list(dict.fromkeys(v for v in values if pd.notna(v)))
    return "/".join(fmt(v) for v in vals) if vals else "?"


def shape(df: pd.DataFrame) -> str:
    """The attention shape of the rows drawn, from the rows: "40 heads x 128, causal, bf16"."""
    causal = _one(df["causal"], lambda c: "causal" if c in (True, "True", "true", 1)
                  else "non-causal")
    return (f"{_one(df['heads'], lambda v: str(int(v)))} heads \u00d7 "
            f"{_one(df['head_dim'], lambda v: str(int(v)))}, {causal}, "
            f"{_one(df['dtype'], lambda v: DTYPES.get(v, str(v)))}")


def _rows(tables) -> pd.DataFrame:
    df = rows_for(tables, "attention")
    return df[(df["world"] == 32) & ((df["sweep"] == SWEEP) | (df["source"] == "paper"))]


def drawn_rows(tables) -> pd.DataFrame:
    """The rows of ``SWEEP`` the figure draws (simulated on the A800, measured on A800s)."""
    df = _rows(tables)
    return df[df["source"] != "paper"]


def make(tables):
    df = _rows(tables)
    fig, axes = new_figure(1, 1, width=5.2, height=3.6)
    ax = axes[0][0]
    if not len(df):
        note_empty(ax)
        return fig, pd.DataFrame()
    rows, flagged = [], False
    for k, (label, system, ls) in enumerate(line_labels(df)):
        colour = series_color(system, label)
        # the legend names every label, also one without a simulated number (all failed, or
        # only published / measured): its markers are known by their colour
        ax.plot([], [], color=colour, lw=1.8, ls=ls, marker=SOURCE_MARKERS["simulated"], ms=3,
                label=label)
        d = df[df["label"] == label].sort_values("seq_len", kind="stable")  # last row wins
        # a simulated number where the paper has OOM (Megatron-CP at 512K, 1M: docs/simulator.md
        # says why): ringed in the method's colour over every other mark, reached by a dotted
        # segment, so the line does not read as agreeing with the paper
        oom = set(d.loc[(d["source"] == "paper") & (d["status"] == "oom"), "seq_len"])
        sim = d[(d["source"] == "simulated") & (d["status"] == "ok") & d["seq_len"].isin(oom)]
        if len(sim):
            ax.scatter(sim["seq_len"], sim["attn_tflops"], s=OOM_RING, facecolors="none",
                       edgecolors=colour, lw=1.8, zorder=7)
            flagged = True
        for src in ("simulated", "paper", "measured"):
            s = d[d["source"] == src].drop_duplicates("seq_len", keep="last")
            ok = (s["status"] == "ok") & s["attn_tflops"].notna()
            if src == "simulated" and ok.any():  # the line breaks where a cell has no number
                agrees = ok & ~s["seq_len"].isin(oom)
                ax.plot(s["seq_len"], s["attn_tflops"].where(agrees), color=colour, lw=1.8,
                        ls=ls, marker=SOURCE_MARKERS[src], ms=3)  # a lone point shows
                if (ok & ~agrees).any():  # from the last cell the paper ran, dotted and faded
                    seg = ok & (s["seq_len"] >= s.loc[agrees, "seq_len"].max()
                                if agrees.any() else ok)
                    ax.plot(s["seq_len"], s["attn_tflops"].where(seg), color=colour, lw=1.4,
                            ls=":", alpha=0.6, marker=SOURCE_MARKERS[src], ms=3)
            elif ok.any():
                ax.scatter(s.loc[ok, "seq_len"], s.loc[ok, "attn_tflops"], color=colour,
                           s=30, marker=SOURCE_MARKERS[src], edgecolor="black", zorder=5)
            # cells without a number at the axis floor: published lowest, then simulated,
            # then measured, each line a little apart
            y = {"paper": 0.03, "simulated": 0.09, "measured": 0.15}[src] + 0.012 * k
            mark_failures(ax, s, "seq_len", y, colour, "attn_tflops")
            rows += [{"system": system, "label": label, "source": src, "world": r["world"],
                      "seq_len": r["seq_len"], "status": status_of(r, "attn_tflops"),
                      "attn_tflops": r["attn_tflops"], "unit": "TFLOP/s per GPU",
                      "oom_in_paper": src == "simulated" and r["status"] == "ok"
                      and r["seq_len"] in oom} for r in s.to_dict("records")]
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(fmt_tokens)
    ax.set_xlabel("sequence length (tokens), 32 GPUs")
    ax.set_ylabel("attention TFLOP/s per GPU")
    ax.set_ylim(0, None)
    if flagged:  # the legend: the methods, then what the marks mean
        ax.scatter([], [], s=OOM_RING, facecolors="none", edgecolors="0.3", lw=1.8,
                   label="simulated, OOM in the paper\n(ringed in the method's colour)")
    ax.scatter([], [], marker=SOURCE_MARKERS["paper"], color="0.5", edgecolor="black", s=30,
               label="published")
    measured = (df["source"] == "measured").any()
    if measured:
        ax.scatter([], [], marker=SOURCE_MARKERS["measured"], color="0.5", edgecolor="black",
                   s=30, label="measured on GPUs")
    # lower right, above the marks at the floor ("center right" covered the paper's 512K and
    # 1M points, which lie high in this figure)
    legend(ax, fontsize=6.5, loc="lower right", bbox_to_anchor=(1.0, 0.1))
    # the marks of the failures drawn, and only those
    status = df.apply(lambda r: status_of(r, "attn_tflops"), axis=1)
    drawn = [st for st in FAILED_MARKERS if (status == st).any()]
    names = {"oom": "\u00d7 OOM", "skipped": "\u25cb skipped", "error": "\u25b3 error",
             "timeout": "\u25bd timeout", "missing": "\u25a1 missing",
             "no value": "* ran, no number"}
    floor = f"; at the floor: {', '.join(names[st] for st in drawn)}" if drawn else ""
    ax.set_title(f"Attention forward+backward, {shape(df)}: simulated (lines), published "
                 "(\u25c6)" + (", measured on GPUs (\u25a0)" if measured else "")
                 + ";\nTFLOP/s: flash-attention convention (backward = "
                 f"{BACKWARD_OVER_FORWARD:g} \u00d7 forward, causal = half of N\u00b2){floor}",
                 fontsize=8)
    fig.tight_layout()
    return fig, pd.DataFrame(rows)
