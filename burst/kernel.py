"""The one kernel shim: local attention of a block of queries against a block of keys.

Every method (BurstAttention and every baseline) computes local attention through
``block_forward`` / ``block_backward``; nothing else in the project calls an attention kernel,
and every torch / flash-attn version difference is handled here and nowhere else.

Shapes (suffix legend): B batch, Sq/Sk query/key length, H query heads, Hk key/value heads
(H % Hk == 0, GQA is handled by the kernels, never by replicating K/V on the wire), D head dim.
  q_BSHD, k_BSHD, v_BSHD, out_BSHD (input dtype), lse_BHS (fp32; float64 for float64 inputs),
  delta_BHS = rowsum(dO * O) (same dtype as lse).

Contract, identical on every backend (tests/test_kernel_shim.py, tests/test_gpu.py):
  - ``kind`` CAUSAL needs square blocks (Sq == Sk) and is top-left aligned. When
    Sq != Sk, torch's CPU flash op (DESIGN.md 5) and CUDA memory-efficient op are top-left but
    its CUDA flash op and flash-attn are bottom-right (FlashAttention-2's rule; torch's
    dispatcher refuses that case: sdp_utils.cpp, check_flash_causal_non_square_seqlens), so
    the shim never passes ``causal`` for a non-square block: the mask plans of ``burst.masks``
    only emit CAUSAL on square blocks, and this module asserts it.
  - a row that sees no key gets out 0 and lse -inf (the CPU flash op returns lse 0 there, and the
    memory-efficient CUDA op may return NaN; both are fixed here).
  - Backward takes ``delta`` instead of ``out``: BurstAttention's backward circulates D, never O
    (DESIGN.md 3). A caller that holds the rows' own output (the ring backward: its queries stay
    home) may pass it as ``out_BSHD``; otherwise kernels that insist on ``out`` get a stand-in with
    the same row sums against dO: out' = dO * D / |dO|^2 (|out'| <= |O| by Cauchy-Schwarz, so it
    cannot overflow); the kernels use ``out`` only to form D. In bf16/fp16, D is instead written on
    a row's three largest |dO| entries so that the kernels' fp32 sum of exact products is D itself
    (rounding out' moved D by 2^-8 |D|, the whole gradient where the softmax is nearly one-hot).
    Rows whose lse is -inf (no visible key) get zero grads.
    With an lse gradient, delta = D - dlse has no such bound (and no stand-in exists where dO
    is zero): ``burst.attention`` then runs that backward on the ``torch`` backend.

Backends:
  ``torch``      plain matmul + logsumexp in (at least) fp32, any dtype incl. float64, any mask,
                 any device: the test oracle.
  ``cpu_flash``  aten._scaled_dot_product_flash_attention_for_cpu and its backward. Traps
                 (DESIGN.md 5): lse 0 on empty rows, boolean masks rejected (an additive mask is
                 passed), lse non-contiguous.
  ``cuda_sdpa``  PyTorch's CUDA SDPA ops that return lse: on Hopper and newer (sm90+) the cuDNN
                 op (fp16/bf16, no dense mask, as many key/value heads as query heads,
                 head_dim % 8 == 0 and <= 128; 1.7x the flash op's TFLOP/s on an H200 at
                 32K-128K tokens, results/gpu), else the flash op (fp16/bf16, no dense
                 mask, head_dim % 8 == 0 and <= 256; native GQA) and otherwise the
                 memory-efficient op (fp32 too; top-left causal flag or an additive bias whose row
                 stride is padded to 16 elements for its alignment check; its lse comes padded to
                 a multiple of 32 rows). The ops are called by schema argument name, so argument
                 order changes between torch releases (2.9 ... 2.13) cannot shift arguments.
  ``flash_attn`` flash-attn 2 when installed (2.5 ... 2.8: ``window_size`` became
                 ``window_size_left/right`` and ``softcap`` appeared in 2.6/2.7, the forward's
                 return changed from 8 to 4 values, and the functions became torch custom ops);
                 blocks it cannot take (fp32, dense masks, odd head dims) go to ``cuda_sdpa``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import torch

from burst.masks import CAUSAL, DENSE, FULL, bounds_mask

__all__ = [
    "BACKENDS",
    "acc_dtype",
    "available_backends",
    "block_backward",
    "block_forward",
    "kernel_name",
    "resolve_backend",
    "resolve_scale",
]

BACKENDS = ("auto", "torch", "cpu_flash", "cuda_sdpa", "flash_attn")
_HALF = (torch.float16, torch.bfloat16)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for O, LSE and travelling gradients: fp32, or float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def resolve_scale(head_dim: int, scale: float | None = None) -> float:
    """The attention scale: ``head_dim ** -0.5`` by default, else ``scale``, which must be a
    positive finite number (torch's CPU flash kernel returns NaN for causal blocks at scale <= 0,
    and no method of this project needs one)."""
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, torch.Tensor) and scale.requires_grad:  # float() drops its gradient
        raise ValueError(f"softmax_scale={scale!r} requires grad; the scale is a constant of "
                         "the attention (no gradient flows to it): pass a number or a detached "
                         "tensor")
    try:  # a number (a one-element tensor too), not a string that float() would read
        if isinstance(scale, str | bytes | bool):
            raise TypeError
        value = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"softmax_scale={scale!r} must be a positive finite number") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"softmax_scale={scale!r} must be a positive finite number")
    return value


@functools.cache
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


def backend_problem(backend, device: str) -> str | None:
    """Why ``backend`` cannot run tensors on ``device`` (a device type: cpu, cuda, meta), or
    None: the rule ``resolve_backend`` applies, for a sweep's check before anything runs."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        return f"unknown kernel backend {backend!r}; valid backends: {', '.join(BACKENDS)}"
    if backend in ("cuda_sdpa", "flash_attn") and device not in ("cuda", "meta"):
        return (f"kernel backend {backend!r} needs CUDA tensors, got device {device}; use "
                "backend='auto', 'cpu_flash' or 'torch'")
    if backend == "cpu_flash" and device == "cuda":
        return ("kernel backend 'cpu_flash' runs on the CPU, got CUDA tensors; use "
                "backend='auto', 'cuda_sdpa', 'flash_attn' or 'torch'")
    return None


def resolve_backend(backend: str, q: torch.Tensor, kind: str = FULL) -> str:
    """The backend a block of ``q`` under ``kind`` runs on (``auto`` picks by device/dtype)."""
    if why := backend_problem(backend, q.device.type):
        raise ValueError(why)
    if backend == "auto":
        if q.device.type != "cuda":
            return "cpu_flash" if q.device.type == "cpu" else "torch"
        if q.dtype == torch.float64:  # no CUDA SDPA kernel takes float64
            return "torch"
        if _flash_attn_ok(q, kind):
            return "flash_attn"
        return "cuda_sdpa"
    if backend in ("cuda_sdpa", "flash_attn") and q.dtype == torch.float64:
        return "torch"  # no CUDA SDPA or flash-attn kernel takes float64
    if backend == "flash_attn":
        if _flash_attn_module() is None:
            raise ValueError("kernel backend 'flash_attn' needs the flash-attn package "
                             "(pip install 'burst-bench[gpu]'); use backend='cuda_sdpa'")
        if not _flash_attn_ok(q, kind):
            return "cuda_sdpa"  # fp32, dense masks, odd head dims: flash-attn cannot take them
    return backend


def kernel_name(backend: str, q: torch.Tensor, kind: str = FULL,
                kv_heads: int | None = None) -> str:
    """The concrete kernel a block runs on, e.g. ``cuda_sdpa/flash`` (for result rows);
    ``kv_heads`` defaults to q's head count."""
    be = resolve_backend(backend, q, kind)
    if be == "cuda_sdpa":
        hk = q.shape[2] if kv_heads is None else kv_heads
        if _sdpa_cudnn_ok(q, hk, kind):
            return "cuda_sdpa/cudnn"
        return "cuda_sdpa/" + ("flash" if _sdpa_flash_ok(q, kind) else "efficient")
    return be


def _head_dim_ok(q: torch.Tensor) -> bool:
    """Head dims the flash kernels run forward and backward: multiples of 8 up to 256, but not
    192 < D <= 224 on sm86-sm89 and sm120-sm121, which have no flash backward there (flash-attn's
    mha_bwd; torch's dispatcher, which the shim bypasses by calling the ops, turns flash off
    there: sdp_utils.cpp, check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89...)."""
    d = q.shape[-1]
    if d % 8 or d > 256:
        return False
    if not (192 < d <= 224 and q.device.type == "cuda"):
        return True
    cap = torch.cuda.get_device_capability(q.device)
    return not ((8, 6) <= cap <= (8, 9) or (12, 0) <= cap <= (12, 1))


def _ampere_or_newer(q: torch.Tensor) -> bool:
    """Flash kernels (SDPA's and flash-attn 2) need compute capability 8.0+."""
    return q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) >= (8, 0)


def _flash_attn_ok(q: torch.Tensor, kind: str) -> bool:
    return (_flash_attn_module() is not None and q.dtype in _HALF and kind != DENSE
            and _head_dim_ok(q) and _ampere_or_newer(q))


def _sdpa_flash_ok(q: torch.Tensor, kind: str) -> bool:
    return q.dtype in _HALF and kind != DENSE and _head_dim_ok(q) and _ampere_or_newer(q)


_CUDNN_OFF: set[str] = set()  # devices where the cuDNN op refused a block (flash from then on)


def _sdpa_cudnn_ok(q: torch.Tensor, kv_heads: int, kind: str) -> bool:
    """The cuDNN op: Hopper and newer only (on an H200 it runs at 1.7x the flash op's TFLOP/s,
    results/gpu; older GPUs keep the flash op, not measured here), MHA only (GQA not checked on
    a GPU yet: torch's cuDNN backward passes the query's head count to the graph), head dims
    every cuDNN 9 kernel has (<= 128)."""
    if not (q.dtype in _HALF and kind != DENSE and kv_heads == q.shape[2]
            and q.shape[-1] % 8 == 0 and q.shape[-1] <= 128):
        return False
    if q.device.type == "meta":
        return False  # no device to ask: the flash op names the kernel, as before sm90
    if q.device.type != "cuda" or str(q.device) in _CUDNN_OFF:
        return False
    return (torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
            and torch.cuda.get_device_capability(q.device) >= (9, 0)
            and hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention_backward"))


def _cudnn_refused(q: torch.Tensor, err: RuntimeError) -> None:
    """A cuDNN graph that does not build (a shape or stride its heuristics have no engine for)
    is a host-side error raised before any kernel runs: the device falls back to the flash op
    for good, saying so once. Running out of memory is not a refusal."""
    if isinstance(err, torch.OutOfMemoryError):
        raise err
    import warnings

    _CUDNN_OFF.add(str(q.device))
    warnings.warn(f"burst.kernel: the cuDNN attention op refused a block on {q.device} "
                  f"({str(err).splitlines()[0][:200]}); the flash op runs from now on",
                  RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Helpers shared by the backends. Every backend function takes BSHD tensors, a "causal" flag
# (top-left, square blocks only) and an optional boolean mask (Sq, Sk) already on q's device.


def _aten(name: str, **kw):
    """Call ``torch.ops.aten.<name>`` by schema argument names (robust to reordering). An
    argument the installed op lacks may be left out only at its neutral value (None, False,
    0): dropping anything else would change the result silently."""
    op = getattr(torch.ops.aten, name).default
    names = _schema_names(name)
    lost = sorted(k for k, v in kw.items()
                  if k not in names and not (v is None or (isinstance(v, bool | int | float)
                                                           and not v)))
    if lost:
        raise RuntimeError(f"torch.ops.aten.{name} of torch {torch.__version__} has no "
                           f"argument(s) {', '.join(lost)}; valid: {', '.join(sorted(names))}")
    return op(**{k: v for k, v in kw.items() if k in names})


@functools.cache
def _schema_names(name: str) -> frozenset[str]:
    return frozenset(a.name for a in getattr(torch.ops.aten, name).default._schema.arguments)


@functools.cache
def _scalar_zero(device: torch.device) -> torch.Tensor:
    # philox seed/offset placeholders: read by the backward ops only when dropout_p > 0
    return torch.zeros((), dtype=torch.int64, device=device)


def _visible(sq, sk, causal, mask, device):
    if mask is not None:
        return mask
    if causal:
        return torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
    return None


def _additive(mask: torch.Tensor | None, dtype, align: int = 1) -> torch.Tensor | None:
    """0 / -inf bias for a boolean mask; the row stride is padded to a multiple of ``align``."""
    if mask is None:
        return None
    sq, sk = mask.shape
    width = -(-sk // align) * align
    bias = torch.zeros((sq, width), dtype=dtype, device=mask.device)
    bias[:, :sk].masked_fill_(~mask, float("-inf"))
    return bias[:, :sk]


def _repeat_kv(k, v, g):
    return (k, v) if g == 1 else (k.repeat_interleave(g, 2), v.repeat_interleave(g, 2))


def _sum_groups(dk, dv, hk):
    """Per-query-head dK/dV summed over each K/V head's group, in float32 or wider, rounded
    to their dtype once."""
    b, sk, h, d = dk.shape
    if h == hk:
        return dk, dv
    acc = acc_dtype(dk.dtype)
    return tuple(t.reshape(b, sk, hk, h // hk, d).sum(3, dtype=acc).to(t.dtype)
                 for t in (dk, dv))


def _stand_in_out(do: torch.Tensor, delta_BHS: torch.Tensor) -> torch.Tensor:
    """An ``out`` whose row sums against dO equal delta (see the module docstring)."""
    acc = delta_BHS.dtype
    d = delta_BHS.transpose(1, 2)  # B S H
    if do.dtype.itemsize >= 4 or do.shape[-1] < 2:
        return _spread_stand_in(do, d, acc)
    # bf16/fp16: rounding the spread stand-in moves the kernel's D by ~2^-8 |D|, and where the
    # softmax is nearly one-hot the true dS = P (dP - D) is ~0, so that error became the whole
    # gradient (dq 0.11 against 3e-5 for plain bf16 attention with a strong attention sink).
    # Instead D is written on the row's largest |dO| entries, each carrying what the previous
    # one's rounding left: the kernels form D in fp32 from products of two 16-bit numbers, which
    # are exact, so the sum is D to fp32 precision. Chosen and read in the 16-bit dtype (no
    # fp32 copy of dO: this runs at every visit of a block in the burst backward).
    top = do.abs().topk(min(3, do.shape[-1]), dim=-1).indices  # B S H t
    g = do.gather(-1, top).to(acc)
    bf16 = do.dtype == torch.bfloat16
    rest, terms = d, []
    for t in range(top.shape[-1]):
        gt = g[..., t]
        st = torch.where(gt != 0, rest / torch.where(gt != 0, gt, 1), 0).to(do.dtype).to(acc)
        if bf16:  # fp32's range: a term overflows only where a tiny entry would carry the
            # previous one's residue (~2^-8 |D|, the spread's own error): dropped, the next
            # entry may still carry it (NaN is kept: it must surface, not vanish)
            st = torch.where(torch.isinf(st), 0, st)
        terms.append(st)
        rest = rest - gt * st
    terms = torch.stack(terms, -1)  # B S H t (an fp16 overflow is inf since the cast)
    exact = torch.zeros_like(do).scatter_(-1, top, terms.to(do.dtype))
    if bf16:
        return exact
    # fp16: D / max|dO| overflows 65504 with |O| in the thousands: those rows keep the spread
    return torch.where(torch.isfinite(terms).all(-1, keepdim=True), exact,
                       _spread_stand_in(do, d, acc))


def _spread_stand_in(do: torch.Tensor, d: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """out' = dO * D / |dO|^2 (|out'| <= |O|: it cannot overflow), for delta ``d`` (B S H)."""
    tiny = torch.finfo(acc).tiny
    dof = do.to(acc)
    # out = c u with u = dO / max|dO| (so |u|^2 >= 1: a tiny dO cannot underflow its square)
    # and c m |u|^2 = delta
    m = dof.abs().amax(-1)  # B S H
    u = dof / m.clamp_min(tiny).unsqueeze(-1)
    coef = torch.where(m > 0, d / (m * u.square().sum(-1)).clamp_min(tiny), torch.zeros_like(d))
    return (u * coef.unsqueeze(-1)).to(do.dtype)


# ---------------------------------------------------------------------------------------------
# torch: the oracle


def _torch_fwd(q, k, v, scale, causal, mask):
    acc = acc_dtype(q.dtype)
    g = q.shape[2] // k.shape[2]
    qf = q.to(acc).transpose(1, 2)  # B H Sq D
    kf = k.to(acc).transpose(1, 2).repeat_interleave(g, dim=1)
    vf = v.to(acc).transpose(1, 2).repeat_interleave(g, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    vis = _visible(q.shape[1], k.shape[1], causal, mask, q.device)
    if vis is not None:
        s = s.masked_fill(~vis, float("-inf"))
    # normalised by the row max, not by exp(s - lse): lse's rounding (eps * |lse|) would reach
    # every p at large logits; a fully masked row (max -inf) gets e = 0, l = 0, out 0, lse -inf
    # and no NaN; a NaN in q/k/v stays NaN (as in SDPA)
    m = s.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(acc).min)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)  # noqa: E741 - the softmax denominator
    out = ((e @ vf) / l.clamp_min(torch.finfo(acc).tiny)).transpose(1, 2).to(q.dtype)
    lse = (m + torch.log(l)).squeeze(-1)  # B H Sq
    return out, lse


def _torch_bwd(do, q, k, v, lse, delta, scale, causal, mask, out=None):  # takes delta itself
    acc = acc_dtype(q.dtype)
    g = q.shape[2] // k.shape[2]
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
    dk, dv = _sum_groups(dk.transpose(1, 2), dv.transpose(1, 2), k.shape[2])
    return dq.transpose(1, 2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---------------------------------------------------------------------------------------------
# cpu_flash


def _abs_max(t: torch.Tensor) -> float:
    """max |t| of a (CPU) tensor, NaN if it holds one: one aminmax pass, without a copy (a
    per-row isnan().any(-1) on every call made the timed ring forward 9% slower; unlike a
    sum, the max of finite float16 cannot overflow)."""
    if not t.numel():
        return 0.0
    lo, hi = torch.aminmax(t)
    return float(torch.maximum(-lo, hi))


OP, ORACLE, FLOAT64 = "op", "oracle", "float64"  # where a cpu_flash block goes (_route)


def _route(q: torch.Tensor, k: torch.Tensor, scale: float) -> str:
    """OP (torch's fused CPU op), ORACLE (a NaN or an infinity in q or k, which the op
    mishandles) or FLOAT64 (finite q and k whose products may overflow the accumulation dtype,
    scaled or not: the op overflows on q.k before it scales, so the bound
    D max|q| max|k| max(1, |scale|) must stay under its largest value)."""
    bound = _abs_max(q) * _abs_max(k)
    if not math.isfinite(bound):
        return ORACLE
    if bound * q.shape[-1] * max(1.0, abs(scale)) > torch.finfo(acc_dtype(q.dtype)).max:
        return FLOAT64
    return OP


ORACLE_CHUNK_SCORES = 1 << 24  # scores a chunk of the oracle fallback holds (64 MiB in fp32)


def _row_chunks(q, k, causal, mask):
    """(a, b, visible) for chunks of at least 64 query rows, so that a long CPU block holds a
    bounded share of its scores in the oracle (a 128K-token shard's whole matrix is tens of
    GiB); ``visible``: the chunk's bool mask, or None."""
    sq, sk = q.shape[1], k.shape[1]
    rows = max(64, ORACLE_CHUNK_SCORES // max(1, q.shape[0] * q.shape[2] * sk))
    keys = torch.arange(sk, device=q.device)
    for a in range(0, sq, rows):
        b = min(sq, a + rows)
        vis = None if mask is None else mask[a:b]
        if causal:  # top-left: row i sees keys j <= i
            tri = keys <= torch.arange(a, b, device=q.device)[:, None]
            vis = tri if vis is None else vis & tri
        yield a, b, vis


def _oracle_in_chunks(q, k, v, scale, causal, mask):
    """The oracle's forward over ``_row_chunks``."""
    outs, lses = zip(*(_torch_fwd(q[:, a:b], k, v, scale, False, vis)
                       for a, b, vis in _row_chunks(q, k, causal, mask)), strict=True)
    return torch.cat(outs, 1), torch.cat(lses, 2)


def _forward_in_float64(q, k, v, scale, causal, mask):
    """The oracle in float64 for scores that may overflow the accumulation dtype; an error
    where a row's lse in this block does (the block's result cannot be stated in that dtype,
    even where, far below it, its weight in the row's merge would be 0)."""
    out, lse = _oracle_in_chunks(q.double(), k.double(), v.double(), scale, causal, mask)
    top = torch.finfo(acc_dtype(q.dtype)).max
    over = lse.isfinite() & (lse.abs() > top)
    if over.any():
        raise OverflowError(
            f"attention logits overflow {acc_dtype(q.dtype)}: a query's log-sum-exp is "
            f"{float(lse[over][0]):.3g}, beyond {top:.3g} (|q| up to {_abs_max(q):.3g}, |k| up "
            f"to {_abs_max(k):.3g}, scale {scale:.3g}); scale q or k down")
    return out.to(q.dtype), lse.to(acc_dtype(q.dtype))


def _backward_in_float64(do, q, k, v, lse, delta, scale, causal, mask):
    """The oracle's backward in float64 over ``_row_chunks`` (dq by rows, dk and dv summed)."""
    k64, v64 = k.double(), v.double()
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k64), torch.zeros_like(v64)
    for a, b, vis in _row_chunks(q, k, causal, mask):
        dq_c, dk_c, dv_c = _torch_bwd(do[:, a:b].double(), q[:, a:b].double(), k64, v64,
                                      lse[:, :, a:b].double(), delta[:, :, a:b].double(),
                                      scale, False, vis)
        dq[:, a:b] = dq_c
        dk += dk_c
        dv += dv_c
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def _cpu_flash_fwd(q, k, v, scale, causal, mask):
    # torch's CPU op mishandles rows that meet a NaN or an infinity: a query row holding a NaN,
    # against few keys, gets out 0 and a finite lse (a fuzz: zigzag on 4 ranks of 4 tokens); a
    # row whose visible keys in the block meet a NaN in k, or an infinity in q or k (or finite
    # q and k whose float32 products overflow) that scores them all -inf, gets out 0 and lse 0,
    # which the ring's merge counts as a key of logit 0 (a NaN dropped from the output, every
    # row shrunk: numerical audits). The oracle gives NaN, or (0, -inf), as the whole row's
    # one kernel call would; scores that may overflow are computed in float64.
    route = _route(q, k, scale)
    if route == ORACLE:
        return _oracle_in_chunks(q, k, v, scale, causal, mask)
    if route == FLOAT64:
        return _forward_in_float64(q, k, v, scale, causal, mask)
    out, lse = _aten("_scaled_dot_product_flash_attention_for_cpu",
                     query=q.transpose(1, 2), key=k.transpose(1, 2), value=v.transpose(1, 2),
                     dropout_p=0.0, is_causal=causal, attn_mask=_additive(mask, q.dtype),
                     scale=scale)
    return out.transpose(1, 2), lse.to(acc_dtype(q.dtype)).contiguous()


def _cpu_flash_bwd(do, q, k, v, lse, delta, scale, causal, mask, out=None):
    if _route(q, k, scale) == FLOAT64:
        return _backward_in_float64(do, q, k, v, lse, delta, scale, causal, mask)
    out = _stand_in_out(do, delta) if out is None else out
    # K/V repeated to the query heads and each group's gradients summed here, as the cuda_sdpa
    # path does: given fewer K/V heads, torch's op sums a group's dK/dV in the input's dtype,
    # 2-3x the naive bf16 error at 32/1 heads (an audit; torch 2.13, F.sdpa's enable_gqa alike)
    # (float32 and float64 inputs are summed in their own dtype, the accumulation dtype: there
    # the op takes the K/V heads as they are, 8-9% less backward time at 8/2 heads, 1024 tokens)
    hk = k.shape[2]
    ke, ve = _repeat_kv(k, v, q.shape[2] // hk) if q.dtype in _HALF else (k, v)
    dq, dk, dv = _aten(
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        grad_out=do.transpose(1, 2), query=q.transpose(1, 2), key=ke.transpose(1, 2),
        value=ve.transpose(1, 2), out=out.transpose(1, 2), logsumexp=lse.to(acc_dtype(q.dtype)),
        dropout_p=0.0, is_causal=causal, attn_mask=_additive(mask, q.dtype), scale=scale)
    dk, dv = _sum_groups(dk.transpose(1, 2), dv.transpose(1, 2), hk)
    return dq.transpose(1, 2), dk, dv


# ---------------------------------------------------------------------------------------------
# cuda_sdpa: the flash op where it applies, else the memory-efficient op

_EFF_ALIGN = 16  # the efficient kernels check bias row stride % (16 bytes / elem); 16 covers all
_EFF_LSE_ROWS = 32  # the efficient forward pads lse to a multiple of 32 query rows


def _cudnn_fwd(q, k, v, scale, causal):
    """torch's cuDNN op, ungated (``_sdpa_cudnn_ok`` says where the shim uses it)."""
    res = _aten("_scaled_dot_product_cudnn_attention", query=q.transpose(1, 2),
                key=k.transpose(1, 2), value=v.transpose(1, 2), attn_bias=None,
                compute_log_sumexp=True, dropout_p=0.0, is_causal=causal,
                return_debug_mask=False, scale=scale)
    b, sq, h, _ = q.shape  # its lse is (B, H, Sq, 1)
    return res[0].transpose(1, 2), res[1].reshape(b, h, sq).float()


def _cudnn_bwd(do, q, k, v, out, lse, scale, causal):
    """Its backward, ungated; max_q / max_k are the lengths it runs on (not read off q, k)."""
    b, sq, h, _ = q.shape
    zero = _scalar_zero(q.device)
    dq, dk, dv = _aten(
        "_scaled_dot_product_cudnn_attention_backward", grad_out=do.transpose(1, 2),
        query=q.transpose(1, 2), key=k.transpose(1, 2), value=v.transpose(1, 2),
        out=out.transpose(1, 2), logsumexp=lse.float().reshape(b, h, sq, 1).contiguous(),
        philox_seed=zero, philox_offset=zero, attn_bias=None, cum_seq_q=None, cum_seq_k=None,
        max_q=sq, max_k=k.shape[1], dropout_p=0.0, is_causal=causal, scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _cuda_sdpa_fwd(q, k, v, scale, causal, mask):
    sq = q.shape[1]
    if mask is None and _sdpa_cudnn_ok(q, k.shape[2], FULL):
        try:
            return _cudnn_fwd(q, k, v, scale, causal)
        except RuntimeError as err:
            _cudnn_refused(q, err)
    if mask is None and _sdpa_flash_ok(q, FULL):
        res = _aten("_scaled_dot_product_flash_attention", query=q.transpose(1, 2),
                    key=k.transpose(1, 2), value=v.transpose(1, 2), dropout_p=0.0,
                    is_causal=causal, return_debug_mask=False, scale=scale)
        out, lse = res[0], res[1]
    else:
        ke, ve = _repeat_kv(k, v, q.shape[2] // k.shape[2])  # no native GQA in this op
        bias = _additive(mask, q.dtype, _EFF_ALIGN)
        if bias is not None:
            bias = bias.expand(q.shape[0], q.shape[2], *bias.shape)
        d, (qp, kp, vp) = q.shape[-1], _pad_head_dim(q, ke, ve)
        res = _aten("_scaled_dot_product_efficient_attention", query=qp.transpose(1, 2),
                    key=kp.transpose(1, 2), value=vp.transpose(1, 2), attn_bias=bias,
                    compute_log_sumexp=True, dropout_p=0.0, is_causal=causal and mask is None,
                    scale=scale)
        out, lse = res[0][..., :d], res[1][..., :sq]
    return out.transpose(1, 2), lse.float().contiguous()


def _pad_head_dim(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Zero-pad head_dim to the memory-efficient kernel's alignment (128 bits: 8 fp16/bf16 or
    4 fp32 elements; on sm80+ torch builds only its aligned kernels, cutlassF.h / cutlassB.h).
    Zero columns change no score (the scale is passed explicitly) and no output column below
    head_dim, whose results are sliced back."""
    d = ts[0].shape[-1]
    align = 4 if ts[0].dtype == torch.float32 else 8
    pad = (-d) % align
    return ts if pad == 0 else tuple(torch.nn.functional.pad(t, (0, pad)) for t in ts)


def _cuda_sdpa_bwd(do, q, k, v, lse, delta, scale, causal, mask, out=None):
    b, sq, h, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = _stand_in_out(do, delta) if out is None else out
    zero = _scalar_zero(q.device)
    if mask is None and _sdpa_cudnn_ok(q, hk, FULL):
        try:
            return _cudnn_bwd(do, q, k, v, out, lse, scale, causal)
        except RuntimeError as err:
            _cudnn_refused(q, err)
    if mask is None and _sdpa_flash_ok(q, FULL):
        dq, dk, dv = _aten(
            "_scaled_dot_product_flash_attention_backward", grad_out=do.transpose(1, 2),
            query=q.transpose(1, 2), key=k.transpose(1, 2), value=v.transpose(1, 2),
            out=out.transpose(1, 2), logsumexp=lse.float().contiguous(), cum_seq_q=None,
            cum_seq_k=None, max_q=sq, max_k=sk, dropout_p=0.0, is_causal=causal,
            philox_seed=zero, philox_offset=zero, scale=scale)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    ke, ve = _repeat_kv(k, v, h // hk)
    bias = _additive(mask, q.dtype, _EFF_ALIGN)
    if bias is not None:
        bias = bias.expand(b, h, sq, sk)
    pad = (-sq) % _EFF_LSE_ROWS
    lse_p = torch.nn.functional.pad(lse.float(), (0, pad)).contiguous()
    d = q.shape[-1]
    dop, qp, kp, vp, outp = _pad_head_dim(do, q, ke, ve, out)
    res = _aten(
        "_scaled_dot_product_efficient_attention_backward", grad_out_=dop.transpose(1, 2),
        query=qp.transpose(1, 2), key=kp.transpose(1, 2), value=vp.transpose(1, 2),
        attn_bias=bias, out=outp.transpose(1, 2), logsumexp=lse_p, philox_seed=zero,
        philox_offset=zero, dropout_p=0.0, grad_input_mask=[True, True, True, False],
        is_causal=causal and mask is None, scale=scale)
    dq, dk, dv = (t.transpose(1, 2)[..., :d] for t in res[:3])
    dk, dv = _sum_groups(dk, dv, hk)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# flash_attn (optional package): the argument set is read from the installed signature


@functools.cache
def _fa_params(which: str) -> frozenset[str]:
    fn = getattr(_flash_attn_module(), which)
    target = fn if inspect.isfunction(fn) else getattr(fn, "_init_fn", fn)  # custom ops: 2.7+
    return frozenset(inspect.signature(target).parameters)


def _fa_window_kwargs(params: frozenset[str]) -> dict:
    kw: dict = {}
    if "window_size" in params:  # flash-attn <= 2.6
        kw["window_size"] = (-1, -1)
    if "window_size_left" in params:  # flash-attn >= 2.7
        kw["window_size_left"] = -1
        kw["window_size_right"] = -1
    if "softcap" in params:  # flash-attn >= 2.6
        kw["softcap"] = 0.0
    return kw


def _flash_attn_fwd(q, k, v, scale, causal, mask):
    assert mask is None, "flash_attn takes no dense mask (resolve_backend routes those away)"
    fai = _flash_attn_module()
    params = _fa_params("_flash_attn_forward")
    kw = dict(q=q, k=k, v=v, dropout_p=0.0, softmax_scale=scale, causal=causal,
              alibi_slopes=None, return_softmax=False, **_fa_window_kwargs(params))
    res = fai._flash_attn_forward(**{n: x for n, x in kw.items() if n in params})
    # <= 2.6: (out, q, k, v, out_padded, lse, S_dmask, rng_state); >= 2.7: (out, lse, S, rng)
    out, lse = (res[0], res[5]) if len(res) == 8 else (res[0], res[1])
    return out[..., : q.shape[-1]], lse.float()


def _flash_attn_bwd(do, q, k, v, lse, delta, scale, causal, mask, out=None):
    assert mask is None, "flash_attn takes no dense mask (resolve_backend routes those away)"
    fai = _flash_attn_module()
    params = _fa_params("_flash_attn_backward")
    out = _stand_in_out(do, delta) if out is None else out.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kw = dict(dout=do.contiguous(), q=q, k=k, v=v, out=out, softmax_lse=lse.float().contiguous(),
              dq=dq, dk=dk, dv=dv, dropout_p=0.0, softmax_scale=scale, causal=causal,
              alibi_slopes=None, deterministic=False, rng_state=None,
              **_fa_window_kwargs(params))
    fai._flash_attn_backward(**{n: x for n, x in kw.items() if n in params})
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


def _check_kind(kind: str, q_BSHD: torch.Tensor, k_BSHD: torch.Tensor) -> None:
    if kind not in (FULL, CAUSAL, DENSE):  # any other string would have run as FULL
        raise ValueError(f"unknown mask kind {kind!r}; valid kinds: {FULL!r}, {CAUSAL!r}, "
                         f"{DENSE!r} (burst.masks)")
    # top-left (torch) and bottom-right (flash-attn) causal agree only on square blocks
    if kind == CAUSAL and q_BSHD.shape[1] != k_BSHD.shape[1]:
        raise ValueError(f"{kind} block needs Sq == Sk, got {q_BSHD.shape[1]} x "
                         f"{k_BSHD.shape[1]}")


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # masks and key bounds are planned on the host (burst.masks); copied from pinned memory
    # without blocking, the host never waits for the GPU queue (no per-step sync in the ring)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _dense_mask(mask, bounds, sk: int, device: torch.device) -> torch.Tensor:
    """The bool (Sq, Sk) mask of a DENSE block on ``device``: built there from ``bounds`` (query
    i sees keys [lo[i], hi[i])), so only O(Sq) bytes cross over, or an explicit ``mask`` copied."""
    if (mask is None) == (bounds is None):
        raise ValueError("a DENSE block takes exactly one of mask= and bounds=")
    if bounds is None:
        return _to_device(mask, device)
    return bounds_mask(*(_to_device(b, device) for b in bounds), sk)


def _empty_rows(mask, bounds) -> torch.Tensor | None:
    """Rows (Sq,) of a DENSE block that see no key, or None; from the host plan, no device sync
    (an explicit mask on the device costs one)."""
    empty = ~mask.any(-1) if bounds is None else bounds[1] <= bounds[0]
    return empty if bool(empty.any()) else None


def _unit_stride(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor with its last dimension dense: the fused ops, called here without torch's
    dispatcher, assume it and read a strided head_dim (``qkv.unbind(-1)``) silently wrong."""
    return tuple(t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous() for t in ts)


def _attends_nothing(q_BSHD):
    """(out, lse) of query rows that see no key: out 0, lse -inf."""
    b, s, h, _ = q_BSHD.shape
    return torch.zeros_like(q_BSHD), torch.full(
        (b, h, s), -math.inf, dtype=acc_dtype(q_BSHD.dtype), device=q_BSHD.device)


def block_forward(q_BSHD, k_BSHD, v_BSHD, *, scale: float | None = None, kind: str = FULL,
                  mask: torch.Tensor | None = None, bounds=None, backend: str = "auto"):
    """Attention of q against k/v under ``kind`` -> (out_BSHD, lse_BHS).

    ``kind`` is FULL, CAUSAL (square, top-left) or DENSE, given by ``mask`` (bool (Sq, Sk),
    True = visible, on the host or on q's device) or by ``bounds`` (host int tensors lo, hi
    (Sq,): query i sees keys lo[i] <= j < hi[i]; what ``burst.masks.Call`` carries). Rows that
    see no key get out 0 and lse -inf.
    """
    scale = resolve_scale(q_BSHD.shape[-1], scale)
    _check_kind(kind, q_BSHD, k_BSHD)
    fwd = _FWD[resolve_backend(backend, q_BSHD, kind)]
    if not q_BSHD.shape[1] or not k_BSHD.shape[1]:  # the fused CPU op dies (SIGFPE) on these
        return _attends_nothing(q_BSHD)
    q_BSHD, k_BSHD, v_BSHD = _unit_stride(q_BSHD, k_BSHD, v_BSHD)
    if kind != DENSE:
        return fwd(q_BSHD, k_BSHD, v_BSHD, scale, kind == CAUSAL, None)
    out, lse = fwd(q_BSHD, k_BSHD, v_BSHD, scale, False,
                   _dense_mask(mask, bounds, k_BSHD.shape[1], q_BSHD.device))
    empty = _empty_rows(mask, bounds)
    if empty is not None:
        empty = _to_device(empty, q_BSHD.device)
        lse = lse.masked_fill(empty.view(1, 1, -1), float("-inf"))
        out = out.masked_fill(empty.view(1, -1, 1, 1), 0.0)
    return out, lse


def block_backward(do_BSHD, q_BSHD, k_BSHD, v_BSHD, lse_BHS, delta_BHS, *,
                   scale: float | None = None, kind: str = FULL, mask: torch.Tensor | None = None,
                   bounds=None, backend: str = "auto", out_BSHD: torch.Tensor | None = None):
    """Gradients (dq, dk, dv) of one block, given the *global* lse and delta of the query rows
    (a DENSE block by ``mask`` or ``bounds``, as in ``block_forward``).

    ``out_BSHD``: the rows' attention output, where the caller holds it and delta is
    rowsum(dO * out) (no lse gradient): kernels that insist on ``out`` take it instead of
    building a stand-in (the ring backward keeps its queries' output; the burst backward's
    visiting rows bring D, not O)."""
    scale = resolve_scale(q_BSHD.shape[-1], scale)
    _check_kind(kind, q_BSHD, k_BSHD)
    bwd = _BWD[resolve_backend(backend, q_BSHD, kind)]
    if not q_BSHD.shape[1] or not k_BSHD.shape[1]:  # nothing attends: no gradient
        return tuple(torch.zeros_like(x) for x in (q_BSHD, k_BSHD, v_BSHD))
    do_BSHD, q_BSHD, k_BSHD, v_BSHD = _unit_stride(do_BSHD, q_BSHD, k_BSHD, v_BSHD)
    if out_BSHD is not None:
        (out_BSHD,) = _unit_stride(out_BSHD)
    if kind != DENSE:
        return bwd(do_BSHD, q_BSHD, k_BSHD, v_BSHD, lse_BHS, delta_BHS, scale, kind == CAUSAL,
                   None, out=out_BSHD)
    # rows with lse -inf see no key anywhere: lse 0 makes their P = exp(-inf - 0) = 0, not NaN
    lse_BHS = torch.where(torch.isneginf(lse_BHS), torch.zeros_like(lse_BHS), lse_BHS)
    return bwd(do_BSHD, q_BSHD, k_BSHD, v_BSHD, lse_BHS, delta_BHS, scale, False,
               _dense_mask(mask, bounds, k_BSHD.shape[1], q_BSHD.device), out=out_BSHD)
