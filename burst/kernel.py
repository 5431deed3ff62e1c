"""The one kernel shim: local attention of a block of queries against a block of keys.

Every method (BurstAttention and every baseline) computes local attention through
``block_forward`` / ``block_backward``; nothing else in the project calls an attention kernel.

Shapes (suffix legend): B batch, Sq/Sk query/key length, H query heads, Hk key/value heads
(H % Hk == 0, GQA is handled by the kernels, never by replicating K/V), D head dim.
  q_BSHD, k_BSHD, v_BSHD, out_BSHD (input dtype), lse_BHS (fp32; float64 for float64 inputs),
  delta_BHS = rowsum(dO * O) (same dtype as lse).

Backward takes ``delta`` instead of ``out``: BurstAttention's backward circulates D, never O
(DESIGN.md 3). Kernels that insist on ``out`` get a stand-in with the same row sums against dO:
out' = dO * D / |dO|^2 (|out'| <= |O| by Cauchy-Schwarz, so it cannot overflow); the kernels use
``out`` only to form D.

Backends:
  ``torch``     plain matmul + logsumexp in (at least) fp32, any dtype incl. float64, any mask:
                the test oracle.
  ``cpu_flash`` aten._scaled_dot_product_flash_attention_for_cpu and its backward. Traps
                (DESIGN.md 5): a fully masked row returns lse = 0 (fixed here to -inf), boolean
                masks are rejected (an additive mask is passed), lse is non-contiguous.
  ``cuda_sdpa`` PyTorch's CUDA flash (fp16/bf16, no mask) or memory-efficient SDPA ops (fp32,
                additive masks); both return lse.
  ``flash_attn``flash-attn 2 when installed (fp16/bf16, no mask).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from burst.masks import CAUSAL, DENSE, FULL, STRICT

__all__ = [
    "BACKENDS",
    "acc_dtype",
    "available_backends",
    "block_backward",
    "block_forward",
    "resolve_backend",
]

BACKENDS = ("auto", "torch", "cpu_flash", "cuda_sdpa", "flash_attn")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for O, LSE and travelling gradients: fp32, or float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _flash_attn_module():
    try:
        import flash_attn.flash_attn_interface as fai  # type: ignore[import-not-found]
    except Exception:
        return None
    return fai


def available_backends() -> list[str]:
    out = ["torch", "cpu_flash"]
    if torch.cuda.is_available():
        out.append("cuda_sdpa")
        if _flash_attn_module() is not None:
            out.append("flash_attn")
    return out


def resolve_backend(backend: str, q: torch.Tensor, kind: str = FULL) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if q.device.type == "cuda":
        half = q.dtype in (torch.float16, torch.bfloat16)
        if half and kind != DENSE and _flash_attn_module() is not None:
            return "flash_attn"
        return "cuda_sdpa"
    return "cpu_flash"


# ---------------------------------------------------------------------------------------------
# Backend implementations on square-or-full blocks. Each takes BSHD tensors and a "causal" flag
# (top-left aligned, square blocks only) or an additive/boolean mask for DENSE.


def _torch_fwd(q, k, v, scale, causal, mask):
    acc = acc_dtype(q.dtype)
    h, hk = q.shape[2], k.shape[2]
    qf = q.to(acc).transpose(1, 2)  # B H Sq D
    kf = k.to(acc).transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vf = v.to(acc).transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    vis = _visible(q.shape[1], k.shape[1], causal, mask, q.device)
    if vis is not None:
        s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # B H Sq, -inf on fully masked rows
    p = torch.exp(s - lse.unsqueeze(-1).clamp_min(torch.finfo(acc).min))
    p = torch.nan_to_num(p, nan=0.0)
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    return out, lse


def _torch_bwd(do, q, k, v, lse, delta, scale, causal, mask):
    acc = acc_dtype(q.dtype)
    h, hk = q.shape[2], k.shape[2]
    g = h // hk
    qf = q.to(acc).transpose(1, 2)
    kf = k.to(acc).transpose(1, 2).repeat_interleave(g, dim=1)
    vf = v.to(acc).transpose(1, 2).repeat_interleave(g, dim=1)
    dof = do.to(acc).transpose(1, 2)
    s = (qf @ kf.transpose(-1, -2)) * scale
    vis = _visible(q.shape[1], k.shape[1], causal, mask, q.device)
    if vis is not None:
        s = s.masked_fill(~vis, float("-inf"))
    p = torch.exp(s - lse.to(acc).unsqueeze(-1))
    dv = p.transpose(-1, -2) @ dof
    dp = dof @ vf.transpose(-1, -2)
    ds = p * (dp - delta.to(acc).unsqueeze(-1))
    dq = (ds @ kf) * scale
    dk = (ds.transpose(-1, -2) @ qf) * scale
    b, sk, d = k.shape[0], k.shape[1], k.shape[3]
    dk = dk.reshape(b, hk, g, sk, d).sum(2)
    dv = dv.reshape(b, hk, g, sk, d).sum(2)
    return (dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype),
            dv.transpose(1, 2).to(v.dtype))


def _visible(sq, sk, causal, mask, device):
    if mask is not None:
        return mask
    if causal:
        return torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
    return None


def _additive(mask: torch.Tensor | None, dtype) -> torch.Tensor | None:
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def _stand_in_out(do: torch.Tensor, delta_BHS: torch.Tensor) -> torch.Tensor:
    """An ``out`` whose row sums against dO equal delta (see the module docstring)."""
    acc = delta_BHS.dtype
    dof = do.to(acc)
    norm2 = dof.square().sum(-1)  # B S H
    d = delta_BHS.transpose(1, 2)  # B S H
    coef = torch.where(norm2 > 0, d / norm2.clamp_min(torch.finfo(acc).tiny), torch.zeros_like(d))
    return (dof * coef.unsqueeze(-1)).to(do.dtype)


def _fix_empty_rows(out, lse, mask):
    if mask is None:
        return out, lse
    empty = ~mask.any(-1)  # Sq
    if bool(empty.any()):
        lse = lse.masked_fill(empty.view(1, 1, -1), float("-inf"))
        out = out.masked_fill(empty.view(1, -1, 1, 1), 0.0)
    return out, lse


def _cpu_flash_fwd(q, k, v, scale, causal, mask):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal,
        attn_mask=_additive(mask, q.dtype), scale=scale)
    out, lse = out.transpose(1, 2), lse.to(acc_dtype(q.dtype)).contiguous()
    return _fix_empty_rows(out, lse, mask)


def _cpu_flash_bwd(do, q, k, v, lse, delta, scale, causal, mask):
    out = _stand_in_out(do, delta)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        out.transpose(1, 2), lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32),
        0.0, causal, attn_mask=_additive(mask, q.dtype), scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _cuda_sdpa_fwd(q, k, v, scale, causal, mask):
    h, hk = q.shape[2], k.shape[2]
    if h != hk:  # the CUDA SDPA ops have no native GQA
        k, v = k.repeat_interleave(h // hk, 2), v.repeat_interleave(h // hk, 2)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if mask is None and q.dtype in (torch.float16, torch.bfloat16):
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            qt, kt, vt, 0.0, causal, False, scale=scale)
        out, lse = res[0], res[1]
    else:
        bias = _additive(mask if mask is not None else _visible(
            q.shape[1], k.shape[1], causal, None, q.device), q.dtype)
        if bias is not None:
            bias = bias.expand(q.shape[0], h, *bias.shape)
        res = torch.ops.aten._scaled_dot_product_efficient_attention(
            qt, kt, vt, bias, True, 0.0, False, scale=scale)
        out, lse = res[0], res[1][..., : q.shape[1]]
    out, lse = out.transpose(1, 2), lse.float().contiguous()
    return _fix_empty_rows(out, lse, mask)


def _cuda_sdpa_bwd(do, q, k, v, lse, delta, scale, causal, mask):
    h, hk = q.shape[2], k.shape[2]
    g = h // hk
    ke, ve = (k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)) if g > 1 else (k, v)
    out = _stand_in_out(do, delta)
    qt, kt, vt, ot, dot = (x.transpose(1, 2) for x in (q, ke, ve, out, do))
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if mask is None and q.dtype in (torch.float16, torch.bfloat16):
        z = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dot, qt, kt, vt, ot, lse.float().contiguous(), None, None, sq, sk, 0.0, causal,
            z, z, scale=scale)
    else:
        bias = _additive(mask if mask is not None else _visible(sq, sk, causal, None, q.device),
                         q.dtype)
        if bias is not None:
            bias = bias.expand(b, h, sq, sk)
        pad = (-sq) % 32  # efficient attention keeps lse padded to 32 rows
        lse_p = torch.nn.functional.pad(lse.float(), (0, pad)).contiguous()
        z = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dot, qt, kt, vt, bias, ot, lse_p, z, z, 0.0, [True, True, True, False], False,
            scale=scale)
    dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    if g > 1:
        dk = dk.reshape(b, sk, hk, g, -1).sum(3)
        dv = dv.reshape(b, sk, hk, g, -1).sum(3)
    return dq, dk, dv


def _flash_attn_fwd(q, k, v, scale, causal, mask):
    fai = _flash_attn_module()
    if mask is not None:
        raise ValueError("flash_attn backend takes no dense mask; use backend='cuda_sdpa'")
    res = fai._flash_attn_forward(q, k, v, 0.0, scale, causal=causal, window_size_left=-1,
                                  window_size_right=-1, softcap=0.0, alibi_slopes=None,
                                  return_softmax=False)
    return res[0], res[1].float()


def _flash_attn_bwd(do, q, k, v, lse, delta, scale, causal, mask):
    fai = _flash_attn_module()
    out = _stand_in_out(do, delta)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fai._flash_attn_backward(do.contiguous(), q, k, v, out, lse.float().contiguous(), dq, dk, dv,
                             0.0, scale, causal, -1, -1, 0.0, None, False)
    return dq, dk, dv


_FWD: dict[str, Callable] = {
    "torch": _torch_fwd, "cpu_flash": _cpu_flash_fwd, "cuda_sdpa": _cuda_sdpa_fwd,
    "flash_attn": _flash_attn_fwd,
}
_BWD: dict[str, Callable] = {
    "torch": _torch_bwd, "cpu_flash": _cpu_flash_bwd, "cuda_sdpa": _cuda_sdpa_bwd,
    "flash_attn": _flash_attn_bwd,
}


# ---------------------------------------------------------------------------------------------
# Public entry points: one block, one mask kind.


def block_forward(q_BSHD, k_BSHD, v_BSHD, *, scale: float | None = None, kind: str = FULL,
                  mask: torch.Tensor | None = None, backend: str = "auto"):
    """Attention of q against k/v under ``kind`` -> (out_BSHD, lse_BHS).

    ``kind`` is FULL, CAUSAL (square, top-left), STRICT (square, diagonal excluded) or DENSE
    (``mask`` bool (Sq, Sk), True = visible). Rows that see no key get out 0 and lse -inf.
    """
    scale = q_BSHD.shape[-1] ** -0.5 if scale is None else scale
    be = resolve_backend(backend, q_BSHD, kind)
    fwd = _FWD[be]
    if kind == STRICT:
        b, s, h, d = q_BSHD.shape
        out = torch.zeros_like(q_BSHD)
        lse = torch.full((b, h, s), -math.inf, dtype=acc_dtype(q_BSHD.dtype), device=q_BSHD.device)
        if s > 1:
            o1, l1 = fwd(q_BSHD[:, 1:], k_BSHD[:, :-1], v_BSHD[:, :-1], scale, True, None)
            out[:, 1:] = o1
            lse[:, :, 1:] = l1
        return out, lse
    return fwd(q_BSHD, k_BSHD, v_BSHD, scale, kind == CAUSAL, mask if kind == DENSE else None)


def block_backward(do_BSHD, q_BSHD, k_BSHD, v_BSHD, lse_BHS, delta_BHS, *,
                   scale: float | None = None, kind: str = FULL, mask: torch.Tensor | None = None,
                   backend: str = "auto"):
    """Gradients (dq, dk, dv) of one block, given the *global* lse and delta of the query rows."""
    scale = q_BSHD.shape[-1] ** -0.5 if scale is None else scale
    be = resolve_backend(backend, q_BSHD, kind)
    bwd = _BWD[be]
    if kind == STRICT:
        dq, dk, dv = (torch.zeros_like(x) for x in (q_BSHD, k_BSHD, v_BSHD))
        if q_BSHD.shape[1] > 1:
            g = bwd(do_BSHD[:, 1:], q_BSHD[:, 1:], k_BSHD[:, :-1], v_BSHD[:, :-1],
                    lse_BHS[:, :, 1:], delta_BHS[:, :, 1:], scale, True, None)
            dq[:, 1:], dk[:, :-1], dv[:, :-1] = g
        return dq, dk, dv
    return bwd(do_BSHD, q_BSHD, k_BSHD, v_BSHD, lse_BHS, delta_BHS, scale, kind == CAUSAL,
               mask if kind == DENSE else None)
