"""Single-process references on the full sequence: the float64 oracle and the plain-dtype one.

``reference_attention`` is the test oracle (run it in float64). ``naive_attention`` is the plain
PyTorch implementation in the inputs' dtype (matmuls and softmax in that dtype); its error against
the oracle sets the tolerance for low-precision kernels (flash-attention's rule: a kernel passes
when its max error is at most twice the naive implementation's in the same dtype). A whole ring
rounds every block's partial result to the input dtype before its fp32 merge, so its max error
can exceed that (worst over 20 seeds: MHA 3.39x max, 1.22x RMS; 8 query heads on 1 kv head
2.35x max, 1.27x RMS: scripts/bench_precision.py, results/precision.txt). The tests' rule for
whole rings, a regression guard on fixed seeds with MHA shapes and one GQA shape (16 query heads
on 1, tests/test_burst_attention.py), is RMS within 1.25x and max within 3x
(tests/test_emulate.py).

Shapes: q (B, N, H, D), k/v (B, N, Hk, D), full global sequences in natural order.
"""

from __future__ import annotations

import torch

from burst.attention import qkv_problems
from burst.kernel import block_forward, resolve_scale
from burst.layout import heads_problem
from burst.masks import DENSE, FULL, MaskSpec

__all__ = ["naive_attention", "reference_attention"]


def _mask(spec: MaskSpec, n: int, device) -> torch.Tensor | None:
    if not spec.causal and spec.is_plain:
        return None
    pos = torch.arange(n, device=device)
    return spec.visible(pos, pos)


def _check(who: str, q, k, v) -> None:
    """The shapes every method takes (``burst.attention.qkv_problems``) and H % Hk == 0: a q
    batch of 1 against k of 2 broadcast, 3-dim inputs attended across heads, and 1 query head
    on 2 kv heads gave an empty output (a review)."""
    problems = qkv_problems(q, k, v)
    if not problems and (why := heads_problem(q.shape[2], k.shape[2])):
        problems.append(why)
    if problems:
        raise ValueError(f"{who}: " + "; ".join(problems))


def reference_attention(q, k, v, *, causal=False, window=None, cu_seqlens=None, scale=None):
    """Differentiable (out, lse) of full attention with plain matmul/logsumexp (oracle)."""
    _check("reference_attention", q, k, v)
    spec = MaskSpec(causal=causal, window=window, cu_seqlens=cu_seqlens)
    spec.check_length(q.shape[1])
    mask = _mask(spec, q.shape[1], q.device)
    return block_forward(q, k, v, scale=scale, kind=FULL if mask is None else DENSE, mask=mask,
                         backend="torch")


def naive_attention(q, k, v, *, causal=False, window=None, cu_seqlens=None, scale=None):
    """Attention computed entirely in the inputs' dtype (the baseline for the tolerance rule)."""
    _check("naive_attention", q, k, v)
    spec = MaskSpec(causal=causal, window=window, cu_seqlens=cu_seqlens)
    spec.check_length(q.shape[1])
    scale = resolve_scale(q.shape[-1], scale)
    g = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(g, 1)
    vt = v.transpose(1, 2).repeat_interleave(g, 1)
    s = (qt @ kt.transpose(-1, -2)) * scale
    mask = _mask(spec, q.shape[1], q.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return (p @ vt).transpose(1, 2)
