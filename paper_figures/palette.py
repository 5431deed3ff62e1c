"""One fixed colour per method (or paper system), used by every figure.

Keys are the paper's system names (``results.paper``: method column) and the registry names of
the methods (``baselines.registry``); ``color(key)`` falls back to a stable grey for unknown
keys so that a new method never breaks a figure. BurstEngine's own entries are warm (red,
orange), the baselines cool, so the paper's comparison reads at a glance.
"""

from __future__ import annotations

import hashlib

__all__ = ["COLORS", "FULL_RECOMPUTE", "FULL_RECOMPUTE_HATCH",
           "FULL_RECOMPUTE_LABEL", "MODE_COLORS", "MODEL_COLORS",
           "ORDER", "SOURCE_MARKERS", "color", "hatch", "linestyle", "palette", "series_color"]

COLORS: dict[str, str] = {
    # the paper's systems
    "burstengine": "#c0392b",
    "burst": "#c0392b",
    "burstengine_usp": "#e67e22",
    "loongtrain_double_ring": "#2e86c1",
    "loongtrain_usp": "#17a589",
    "megatron_cp": "#7f8c8d",
    "deepspeed_ulysses": "#8e44ad",
    # registry methods (this project's implementations)
    "ring": "#95a5a6",
    "zigzag_ring": "#5d6d7e",
    "striped_ring": "#34495e",
    "double_ring": "#5dade2",
    "allgather": "#b7950b",
    "ulysses": "#a569bd",
    "usp": "#48c9b0",
    "tp": "#6e2c00",
    "ring_flash_attn": "#aab7b8",
    "yunchang": "#76d7c4",
}

# the order methods appear in, left to right (baselines first, ours last as in the paper)
ORDER = ("megatron_cp", "deepspeed_ulysses", "loongtrain_double_ring", "loongtrain_usp",
         "burst", "burstengine", "burstengine_usp", "ring", "zigzag_ring", "striped_ring",
         "allgather", "ulysses", "tp", "double_ring", "usp", "ring_flash_attn", "yunchang")

# figures whose lines are models or checkpointing modes, not methods, take their colours from
# viridis; a few lie near a method's (14b and selective near the teal of the USP systems, full
# near LoongTrain-Ring's blue), so no figure draws both kinds of line
MODEL_COLORS = {"7b": "#440154", "14b": "#21918c", "70b": "#fde725"}
MODE_COLORS = {"none": "#440154", "full": "#31688e", "selective": "#35b779",
               "selective_half": "#b5de2b"}

# how each source of a number is drawn where several share an axis
SOURCE_MARKERS = {"simulated": "o", "paper": "D", "measured": "s"}


def _lighten(hex_color: str, amount: float) -> str:
    rgb = [int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def color(key: str) -> str:
    """The method's colour; a variant label ``method[options]`` gets a lighter shade of it."""
    if key in COLORS:
        return COLORS[key]
    base, _, variant = key.partition("[")
    if variant and base in COLORS:
        step = int(hashlib.sha256(variant.encode()).hexdigest()[:2], 16) % 3
        return _lighten(COLORS[base], 0.3 + 0.15 * step)
    shade = int(hashlib.sha256(key.encode()).hexdigest()[:2], 16) % 96 + 96
    return f"#{shade:02x}{shade:02x}{shade:02x}"


def series_color(system: str, label: str | None = None) -> str:
    """The colour every figure draws a series (bar, line) in: its system's (``color``), so
    that two labels of one system share it (Burst-Ring and Burst-Ring w/o sele-ckpt); a label
    that is a variant of its method (``burst[bwd=ring]``) gets that variant's lighter shade."""
    if label is not None and (label == system or label.startswith(f"{system}[")):
        return color(label)
    return color(system)


# full checkpointing (the paper's "w/o sele-ckpt": every layer recomputed in the backward) is
# drawn hatched (bars) or dashed (lines); every other mode plain / solid
FULL_RECOMPUTE = "full"
FULL_RECOMPUTE_HATCH = "//"
FULL_RECOMPUTE_LABEL = "hatched: w/o sele-ckpt (full recomputation)"


def hatch(checkpointing) -> str:
    """A bar's hatch for its checkpointing mode ('' = none)."""
    return FULL_RECOMPUTE_HATCH if checkpointing == FULL_RECOMPUTE else ""


def linestyle(checkpointing) -> str:
    """A line's style for its checkpointing mode."""
    return "--" if checkpointing == FULL_RECOMPUTE else "-"


def palette(keys) -> dict[str, str]:
    return {k: color(k) for k in keys}
