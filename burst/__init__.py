"""BurstAttention and BurstEngine: distributed attention for extremely long sequences."""

from burst import comm
from burst.attention import burst_attn, ring_attention
from burst.layout import LAYOUTS, shard, unshard
from burst.masks import MaskSpec

__all__ = ["LAYOUTS", "MaskSpec", "burst_attn", "comm", "ring_attention", "shard", "unshard"]
