"""BurstAttention and BurstEngine: distributed attention for extremely long sequences."""

import re

import torch

MIN_TORCH = (2, 9)


def check_torch(version=torch.__version__) -> None:
    """Refuse a torch older than ``MIN_TORCH``: its CPU flash-attention ops read and write K/V
    out of bounds with GQA (garbage outputs or heap corruption, not an error; fixed by
    pytorch/pytorch#157893 in 2.9), and 2.5-2.7 segfault in the engine's checkpointing. pip
    enforces the same floor (pyproject.toml); this covers a checkout used via PYTHONPATH."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", str(version)).groups())
    if (major, minor) < MIN_TORCH:  # a pre-release or vendor build of the floor passes
        raise ImportError(f"burst needs torch >= {'.'.join(map(str, MIN_TORCH))}; this is torch "
                          f"{version}, whose CPU flash-attention ops corrupt memory with GQA "
                          "(pytorch/pytorch#157893)")


check_torch()

from burst import comm  # noqa: E402
from burst.attention import burst_attn, ring_attention  # noqa: E402
from burst.layout import LAYOUTS, shard, unshard  # noqa: E402
from burst.masks import MaskSpec  # noqa: E402

__all__ = ["LAYOUTS", "MIN_TORCH", "MaskSpec", "burst_attn", "check_torch", "comm",
           "ring_attention", "shard", "unshard"]
