"""What every figure shares: the style, the output (PNG + PDF + the plotted data as CSV)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from results.tables import seq_label  # noqa: E402

__all__ = ["MFU_LABEL", "OUT", "fmt_tokens", "legend", "memory_axes", "new_figure",
           "note_empty", "save", "seq_label", "wrap_path"]

OUT = Path(__file__).resolve().parent / "out"
# the MFU every figure draws: burst.flops' model_flops_causal (the paper's convention)
MFU_LABEL = "MFU (model FLOPs, causal) %"


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 4.2, height: float = 3.2,
               **kw):
    sns.set_theme(style="whitegrid", context="paper", font_scale=0.95)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False, **kw)
    return fig, axes


def fmt_tokens(x, _pos=None) -> str:
    return seq_label(x)


def memory_axes(ax, hw, worlds, ylabel: str) -> None:
    """A memory-per-GPU against sequence-length panel: log-log, token ticks, and the usable
    memory of hardware profile ``hw`` (the simulator's OOM line) dashed; ``worlds``: the GPU
    counts of the panel's rows."""
    ax.axhline(hw.usable_gib, color="black", lw=0.8, ls="--",
               label=f"usable on an {hw.name.upper()} ({hw.usable_gib:g} GiB)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(fmt_tokens)
    gpus = "/".join(str(int(w)) for w in sorted(set(worlds)))
    ax.set_xlabel(f"sequence length (tokens), {gpus} GPUs")
    ax.set_ylabel(ylabel)


def note_empty(ax, text: str = "no rows for this panel") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def wrap_path(path: str, width: int = 36) -> str:
    """A folder's path in lines of about ``width`` characters, broken after a '/' (a long
    --results path in a panel's note must not widen the panel)."""
    lines = [""]
    for piece in re.findall(r"[^/]*/|[^/]+$", str(path)):  # each part with its '/'
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def legend(ax, **kw):
    """The axes' legend, only where something is labelled (else matplotlib warns "No artists
    with labels found", and a figure of no series gets an empty legend box)."""
    handles, _ = ax.get_legend_handles_labels()
    return ax.legend(**kw) if handles else None


def save(fig, data: pd.DataFrame, name: str, out: Path | str = OUT) -> list[Path]:
    """<out>/<name>.png, .pdf and .csv (the exact data the figure shows)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf", out / f"{name}.csv"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    # no creation date: a figure whose data did not change regenerates byte for byte
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None})
    data.to_csv(paths[2], index=False)
    plt.close(fig)
    return paths
