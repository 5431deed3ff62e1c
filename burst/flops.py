"""The one place FLOPs are counted (DESIGN.md 4). Every result names its convention.

Attention: forward = 4 * B * pairs * H * d_h, where ``pairs`` counts attended (query, key) pairs
exactly: N^2 dense, N(N+1)/2 causal, and the exact count for windows and documents. The kernel
convention (flash-attention, the BurstEngine kernel table) counts forward+backward as 3.5x the
forward (backward = 2.5x) with causal counted as half of N^2: ``attention_kernel_flops``.

Model (Megatron's formula, SwiGLU MLP, GQA projections), per training step = 3 passes:
  ``model_flops_causal``  attention pairs causal (halved), 3 x forward  <- the paper's MFU
  ``model_flops_dense``   attention pairs N^2 (not halved), 3 x forward
  ``hardware_flops``      model_flops_causal + what checkpointing recomputes
Configs are duck-typed: anything with hidden_size, num_layers, num_heads, num_kv_heads,
ffn_size, vocab_size (``burst.engine`` configs have them); a ``gated_mlp`` False counts a
two-matrix MLP.
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "BACKWARD_OVER_FORWARD",
    "MFU_DTYPES",
    "PEAK_TFLOPS",
    "CONVENTIONS",
    "attention_flops",
    "attention_flops_halved",
    "attention_kernel_flops",
    "attention_pairs",
    "attention_share",
    "counted_window",
    "gated_mlp",
    "head_flops",
    "layer_flops",
    "mlp_matrices",
    "model_flops",
    "peak_tflops",
    "rate_columns",
    "recompute_flops",
]

# dense bf16 peak per device (DESIGN.md 4), matched as a substring of the device name, the
# first match in this order: the PCIe and NVL parts are slower than the SXM ones (NVIDIA H100 and
# H200 datasheets: 1513 (PCIe) and 1671 (NVL) TFLOP/s bf16 with sparsity, half of it dense)
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H800 PCIe": 756.0, "H200 NVL": 835.0,
               "A100": 312.0, "A800": 312.0, "H100": 989.0, "H800": 989.0, "H200": 989.0}
MFU_DTYPES = ("bfloat16", "float16")  # the peak is the bf16/fp16 tensor-core one


def peak_tflops(name: str) -> float | None:
    for key, val in PEAK_TFLOPS.items():
        if key in name:
            return val
    return None


CONVENTIONS = ("model_flops_causal", "model_flops_dense", "hardware_flops")
CHECKPOINTING = ("none", "full", "selective", "selective_half")


def attention_pairs(seq_len: int, *, causal: bool = False, window: tuple[int, int] | None = None,
                    cu_seqlens: Sequence[int] | None = None) -> int:
    """Exact number of visible (query, key) pairs for one sequence of ``seq_len`` tokens."""
    if not _whole(seq_len):  # -1024 tokens counted as 1023 x 1024 / 2 pairs
        raise ValueError(f"seq_len={seq_len!r}: expected a whole number of tokens >= 0")
    if window is None and cu_seqlens is None and type(causal).__name__ in ("bool", "bool_"):
        causal = bool(causal)  # a plain mask, asked once per rank pair: no MaskSpec built
    else:  # the mask's own rule: causal="no" counted causal, window=(-5, 0) a negative count
        from burst.masks import MaskSpec  # (burst.masks does not import this module)

        spec = MaskSpec(causal=causal, window=window, cu_seqlens=cu_seqlens)
        if spec.cu_seqlens is not None:
            spec.check_length(seq_len)
        causal, window, cu_seqlens = spec.causal, spec.window, spec.cu_seqlens
    docs = ([(0, seq_len)] if not cu_seqlens
            else list(zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)))
    total = 0
    for a, b in docs:
        n = b - a
        if window is None:
            total += n * (n + 1) // 2 if causal else n * n
            continue
        left, right = window
        right = 0 if causal else right
        # per query p: keys in [p - left, p + right] within the document, summed in closed form
        total += (n * (n - 1) // 2 + n * right - _excess(n, n - 1 - right)) - _excess(n, left) + n
    return total


def _excess(n: int, k: int) -> int:
    """sum over p in [0, n) of max(0, p - k)."""
    if k >= n - 1:
        return 0
    if k < 0:
        return n * (n - 1) // 2 - n * k
    m = n - 1 - k
    return m * (m + 1) // 2


def _whole(n) -> bool:
    """A whole number >= 0: a Python int (the common case, checked first), or numpy's; not a
    bool, a float or a tensor."""
    return (type(n) is int or not isinstance(n, bool) and isinstance(n, numbers.Integral)) \
        and n >= 0


def attention_flops(batch: int, seq_len: int, heads: int, head_dim: int, **mask) -> int:
    """Forward FLOPs of attention (QK^T and PV), exact for the mask."""
    if not (_whole(batch) and _whole(heads) and _whole(head_dim)):
        bad = [f"{k}={v!r}" for k, v in (("batch", batch), ("heads", heads),
                                         ("head_dim", head_dim)) if not _whole(v)]
        raise ValueError(f"attention_flops: {', '.join(bad)}: expected whole numbers >= 0")
    return 4 * batch * attention_pairs(seq_len, **mask) * heads * head_dim


def attention_flops_halved(batch: int, seq_len: int, heads: int, head_dim: int, *,
                           causal: bool) -> float:
    """Forward FLOPs with causal counted as N^2/2 pairs (the model-FLOP convention of
    ``model_flops`` and ``recompute_flops``; ``attention_flops`` counts N(N+1)/2 exactly)."""
    pairs = seq_len**2 / 2 if causal else seq_len**2
    return 4 * batch * pairs * heads * head_dim


BACKWARD_OVER_FORWARD = 2.5  # flash-attention convention: backward FLOPs = 2.5 x forward


def counted_window(window, seq_len: int, causal: bool):
    """The window as FLOPs count it: None when it spans the sequence, which it then masks
    nothing of (burst.masks.MaskSpec.over)."""
    if window is None:
        return None
    from burst.masks import MaskSpec

    return MaskSpec(causal=causal, window=window).over(seq_len).window


def _convention_fwd(batch: int, seq_len: int, heads: int, head_dim: int, causal: bool,
                    window: tuple[int, int] | None) -> float:
    """Forward FLOPs as the conventions count them: N^2 (x 0.5 causal); with a sliding window,
    the exact attended pairs (half or all of N^2 would count pairs the window never computes,
    and a windowed run's MFU would exceed 1). A window that spans the sequence (sides of N - 1
    tokens) masks nothing and is counted as no window: one mask, one count."""
    window = counted_window(window, seq_len, causal)
    if window is not None:
        return attention_flops(batch, seq_len, heads, head_dim, causal=causal, window=window)
    return attention_flops_halved(batch, seq_len, heads, head_dim, causal=causal)


def attention_kernel_flops(batch: int, seq_len: int, heads: int, head_dim: int,
                           causal: bool, window: tuple[int, int] | None = None) -> float:
    """Forward+backward FLOPs in the kernel convention: 3.5 x 4*B*N^2*H*d (x 0.5 causal); with
    a sliding window, 3.5 x the exact attended pairs."""
    return (1 + BACKWARD_OVER_FORWARD) * _convention_fwd(batch, seq_len, heads, head_dim,
                                                         causal, window)


def gated_mlp(cfg) -> bool:
    """Whether a config's MLP is SwiGLU (gate, up, down), else up, GELU, down (a duck-typed
    config without ``gated_mlp`` is SwiGLU)."""
    return getattr(cfg, "gated_mlp", True)


def mlp_matrices(cfg) -> int:
    """Weight matrices of one layer's MLP: 3 for SwiGLU, 2 for the GELU MLP."""
    return 3 if gated_mlp(cfg) else 2


def _dense_per_token(cfg) -> int:
    """Forward matmul FLOPs per token outside attention scores, all layers + LM head."""
    h, hd = cfg.hidden_size, cfg.hidden_size // cfg.num_heads
    kv = cfg.num_kv_heads * hd
    proj = 2 * h * (h + 2 * kv) + 2 * h * h  # QKV and output projections
    mlp = 2 * mlp_matrices(cfg) * h * cfg.ffn_size
    return cfg.num_layers * (proj + mlp) + 2 * h * cfg.vocab_size


def head_flops(cfg, batch: int, seq_len: int) -> int:
    """Forward FLOPs of the LM head: 2 x hidden x vocab per token."""
    return 2 * cfg.hidden_size * cfg.vocab_size * batch * seq_len


def layer_flops(cfg, batch: int, seq_len: int) -> int:
    """Forward matmul FLOPs of the layer stack outside the attention scores (projections and
    MLP, every layer)."""
    return _dense_per_token(cfg) * batch * seq_len - head_flops(cfg, batch, seq_len)


def _attn_fwd(cfg, batch: int, seq_len: int, causal_halved: bool, window=None) -> float:
    """Attention forward FLOPs of every layer (a layer's window: the attended pairs of the
    causal model in every convention). ``window``: the model's, one for every layer or one per
    layer (``burst.masks.layer_windows``); None: the config's own (``ModelConfig.window``)."""
    from burst.masks import layer_windows

    if window is None:
        window = getattr(cfg, "window", None)
    hd = cfg.hidden_size // cfg.num_heads
    total = 0.0
    for w, layers in Counter(layer_windows(window, cfg.num_layers)).items():
        w = counted_window(w, seq_len, True)  # the model is causal
        causal = causal_halved or w is not None
        total += layers * _convention_fwd(batch, seq_len, cfg.num_heads, hd, causal, w)
    return total


def recompute_flops(cfg, batch: int, seq_len: int, checkpointing: str, window=None) -> float:
    """Forward FLOPs recomputed in backward by a checkpointing mode (causal attention).

    none: nothing; full: the whole layer stack; selective: the layers without the attention core
    (its output and lse are cached); selective_half: as selective plus the attention of the
    sequence's first N/2 tokens (striped: the first half of every rank's queries against the
    first half of K/V), a quarter of the causal attention; with a window, the pairs that window
    attends among N/2 tokens (about half of its pairs among N when it is short).
    ``window``: the model's sliding window, one for every layer or one per layer (its
    attention counted as the attended pairs); None: the config's own.
    """
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"unknown checkpointing {checkpointing!r}; "
                         f"valid: {', '.join(CHECKPOINTING)}")
    layers_dense = layer_flops(cfg, batch, seq_len)
    attn = _attn_fwd(cfg, batch, seq_len, causal_halved=True, window=window)
    if checkpointing == "selective_half":
        return layers_dense + _attn_fwd(cfg, batch, seq_len // 2, causal_halved=True,
                                        window=window)
    return {"none": 0.0, "full": layers_dense + attn, "selective": layers_dense}[checkpointing]


def model_flops(cfg, batch: int, seq_len: int, convention: str = "model_flops_causal",
                checkpointing: str = "none", window=None) -> float:
    """FLOPs of one training step (forward + backward) under a named convention; ``window``:
    the model's sliding window, one for every layer or one per layer (None: the config's
    own)."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOP convention {convention!r}; valid: {', '.join(CONVENTIONS)}")
    dense = _dense_per_token(cfg) * batch * seq_len
    attn = _attn_fwd(cfg, batch, seq_len, causal_halved=convention != "model_flops_dense",
                     window=window)
    total = 3 * (dense + attn)
    if convention == "hardware_flops":
        total += recompute_flops(cfg, batch, seq_len, checkpointing, window)
    return total


def attention_share(cfg, batch: int, seq_len: int, convention: str = "model_flops_causal",
                    window=None) -> float:
    """Attention's share of a training step's FLOPs under ``convention`` (``model_flops``,
    without recomputation): a windowed layer counts its attended pairs in every convention, a
    global one N^2, halved for causal except in the dense convention."""
    attn = _attn_fwd(cfg, batch, seq_len, causal_halved=convention != "model_flops_dense",
                     window=window)
    return 3 * attn / model_flops(cfg, batch, seq_len, convention, window=window)


def rate_columns(*, time_s: float, batch: int, seq_len: int, world: int, peak: float | None,
                 cfg=None, checkpointing: str = "none", heads: int | None = None,
                 head_dim: int | None = None, causal: bool = True, window=None) -> dict:
    """The rate columns of a result row, per device: ``tokens_per_s``, and for an attention
    layer (``cfg`` None; ``window`` its (left, right)) ``attn_tflops`` in the kernel
    convention, for a training step (``window`` the model's, or one per layer)
    ``tflops_<convention>`` and ``mfu_<convention>`` (None without a ``peak``) of every
    convention. One place for measured, simulated and published rows alike."""
    out = {"tokens_per_s": batch * seq_len / time_s / world}
    if cfg is None:
        fl = attention_kernel_flops(batch, seq_len, heads, head_dim, causal, window)
        out["attn_tflops"] = fl / time_s / world / 1e12
        return out
    for conv in CONVENTIONS:
        tf = model_flops(cfg, batch, seq_len, conv, checkpointing, window) / time_s / world / 1e12
        out[f"tflops_{conv}"] = tf
        out[f"mfu_{conv}"] = tf / peak if peak else None
    return out
