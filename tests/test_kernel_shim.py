"""The kernel shim's contract on CPU, and its CUDA plumbing checked without a GPU (issue 8).

- every CPU backend: same out/lse/grads as the float64 oracle for every block kind, rows that
  see no key give lse -inf, out 0 and zero (not NaN) gradients, causal only on square blocks;
- ``cuda_sdpa`` on the meta device: the aten SDPA ops are called by their schema argument names
  on the installed torch, with the shapes and dtypes the shim expects back (flash path with
  native GQA, efficient path with padded lse and aligned bias);
- ``flash_attn``: fake modules with the signatures and return conventions of flash-attn 2.5,
  2.6 and 2.7+ (custom ops) run through the one shim and give the oracle's numbers.
The numerics on a real GPU are tests/test_gpu.py.
"""

from __future__ import annotations

import types

import pytest
import torch

from burst import kernel
from burst.kernel import block_backward, block_forward, kernel_name
from burst.masks import CAUSAL, DENSE, FULL


def _qkvd(sq=12, sk=12, h=4, hk=2, d=16, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, sq, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, sk, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, sk, hk, d, generator=g, dtype=torch.float64)
    do = torch.randn(2, sq, h, d, generator=g, dtype=torch.float64)
    return [t.to(dtype=dtype, device=device) for t in (q, k, v, do)]


def _mask(sq, sk, seed=1):
    m = torch.rand(sq, sk, generator=torch.Generator().manual_seed(seed)) > 0.5
    m[3] = False  # a row that sees no key
    return m


CASES = [(FULL, None, 12, 9), (CAUSAL, None, 12, 12), (DENSE, _mask(12, 9), 12, 9)]


@pytest.mark.parametrize("backend", ["torch", "cpu_flash"])
@pytest.mark.parametrize(("kind", "mask", "sq", "sk"), CASES)
def test_cpu_backends_follow_the_contract(backend, kind, mask, sq, sk):
    q, k, v, do = _qkvd(sq, sk)
    out, lse = block_forward(q, k, v, kind=kind, mask=mask, backend=backend)
    ref_o, ref_l = block_forward(q, k, v, kind=kind, mask=mask, backend="torch")
    delta = (do * ref_o).sum(-1).transpose(1, 2)
    grads = block_backward(do, q, k, v, ref_l, delta, kind=kind, mask=mask, backend=backend)
    ref_g = block_backward(do, q, k, v, ref_l, delta, kind=kind, mask=mask, backend="torch")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_l))
    finite = torch.isfinite(ref_l)
    assert (lse[finite] - ref_l[finite]).abs().max() < 1e-12
    assert (out - ref_o).abs().max() < 1e-12
    for a, b in zip(grads, ref_g, strict=True):
        assert torch.isfinite(a).all() and (a - b).abs().max() < 1e-12
    # the rows' own output, where the caller holds it (the ring backward), instead of a stand-in
    with_out = block_backward(do, q, k, v, ref_l, delta, kind=kind, mask=mask, backend=backend,
                              out_BSHD=ref_o)
    for a, b in zip(with_out, ref_g, strict=True):
        assert torch.isfinite(a).all() and (a - b).abs().max() < 1e-12
    if mask is not None:  # row 3 sees nothing: out 0, lse -inf, no gradient
        assert torch.isneginf(lse[:, :, 3]).all() and (out[:, 3] == 0).all()
        assert (grads[0][:, 3] == 0).all()
    # against autograd of the oracle: the delta-based backward is the true gradient
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, _ = block_forward(*leaves, kind=kind, mask=mask, backend="torch")
    o.backward(do)
    for a, leaf in zip(grads, leaves, strict=True):
        assert (a - leaf.grad).abs().max() < 1e-12
    # and the oracle itself against softmax written out here, with autograd's gradients (the
    # torch backend was compared with itself alone: a test audit)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse_dense = _softmax_attention(*leaves, kind, mask)
    o.backward(do)
    assert torch.equal(torch.isneginf(lse_dense), torch.isneginf(ref_l))
    assert (lse_dense[finite] - ref_l[finite]).abs().max() < 1e-12
    assert (o - ref_o).abs().max() < 1e-12
    for a, leaf in zip(grads, leaves, strict=True):
        assert (a - leaf.grad).abs().max() < 1e-12


def _softmax_attention(q, k, v, kind, mask):
    """(out, lse (B, H, Sq)) of one block, written out in float64: GQA by repeating the kv
    heads, ``kind`` as burst.masks defines it (CAUSAL top-left on a square block),
    a row that sees no key out 0 and lse -inf."""
    sq, sk, h = q.shape[1], k.shape[1], q.shape[2]
    vis = {FULL: torch.ones(sq, sk, dtype=torch.bool),
           CAUSAL: torch.ones(sq, sk, dtype=torch.bool).tril(), DENSE: mask}[kind]
    kr, vr = (t.repeat_interleave(h // t.shape[2], dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) / q.shape[-1] ** 0.5
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.clamp_min(-1e300).unsqueeze(-1))  # (a row of -inf: p 0, not NaN)
    return torch.einsum("bhqk,bkhd->bqhd", p, vr), lse


@pytest.mark.parametrize("backend", ["torch", "cpu_flash"])
def test_a_strided_head_dim_is_read_as_the_values_it_holds(backend):
    """q, k, v unbound from a packed qkv (stride 3 on head_dim): the fused CPU op, called
    without torch's dispatcher, read them wrongly (error 2.4 forward, 19 backward)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 8, 2, 8, 3, generator=g, dtype=torch.float32).unbind(-1)
    do = torch.randn(2, 8, 2, 8, 2, generator=g, dtype=torch.float32).unbind(-1)[0]
    dense = [t.contiguous() for t in (q, k, v, do)]
    for kind in (FULL, CAUSAL):
        out, lse = block_forward(q, k, v, kind=kind, backend=backend)
        ref_o, ref_l = block_forward(*dense[:3], kind=kind, backend=backend)
        assert (out - ref_o).abs().max() < 1e-6 and (lse - ref_l).abs().max() < 1e-6
        delta = (dense[3] * ref_o).sum(-1).transpose(1, 2)
        got = block_backward(do, q, k, v, ref_l, delta, kind=kind, backend=backend)
        want = block_backward(dense[3], *dense[:3], ref_l, delta, kind=kind, backend=backend)
        for a, b in zip(got, want, strict=True):
            assert (a - b).abs().max() < 1e-5


def test_empty_blocks_attend_to_nothing_in_every_cpu_backend():
    """A zero-length q or k made the fused CPU op raise SIGFPE and end the process; run in a
    child so that a regression is a failure, not a dead test run."""
    import subprocess
    import sys

    code = """
import math, torch
from burst.kernel import block_backward, block_forward
for backend in ("torch", "cpu_flash"):
    for sq, sk in ((4, 0), (0, 4), (0, 0)):
        q, do = torch.randn(1, sq, 2, 8), torch.randn(1, sq, 2, 8)
        k = v = torch.randn(1, sk, 2, 8)
        out, lse = block_forward(q, k, v, backend=backend)
        assert out.shape == q.shape and (out == 0).all() and torch.isneginf(lse).all()
        grads = block_backward(do, q, k, v, lse, torch.zeros(1, 2, sq), backend=backend)
        assert all(g.shape == t.shape and (g == 0).all() for g, t in zip(grads, (q, k, v)))
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.returncode, res.stderr)


def test_the_oracle_backend_keeps_float32_precision_at_large_logits():
    """exp(s - lse) carried lse's rounding (eps * |lse|) into every probability: 10x the error
    of a plain float32 softmax here (logits exact in float32: integer q, k; |lse| ~ 74)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randint(-1, 2, (1, 64, 2, 256), generator=g).double() for _ in range(2))
    v = torch.randn(1, 64, 2, 256, generator=g, dtype=torch.float64)
    ref, _ = block_forward(q, k, v, scale=2.0, backend="torch")
    plain = torch.softmax(2.0 * torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()), -1)
    naive = (torch.einsum("bhqk,bkhd->bqhd", plain, v.float()).double() - ref).abs().max()
    out, _ = block_forward(q.float(), k.float(), v.float(), scale=2.0, backend="torch")
    assert (out.double() - ref).abs().max() < 2 * naive


def test_causal_needs_square_blocks_and_other_kinds_are_refused():
    """Every plan call is FULL, CAUSAL or DENSE (``burst.masks``); any other kind, such as the
    strictly causal one the planner no longer emits, would have run as FULL."""
    q, k, v, do = _qkvd(8, 12)
    with pytest.raises(ValueError, match="needs Sq == Sk"):
        block_forward(q, k, v, kind=CAUSAL)
    lse, delta = torch.zeros(2, 4, 8, dtype=torch.float64), torch.zeros(2, 4, 8)
    for kind in ("strict", "Causal"):
        with pytest.raises(ValueError, match=f"unknown mask kind '{kind}'; valid kinds"):
            block_forward(q, k, v, kind=kind)
        with pytest.raises(ValueError, match=f"unknown mask kind '{kind}'"):
            block_backward(do, q, k, v, lse, delta, kind=kind)


def test_backend_choice_and_errors():
    q = torch.zeros(1, 4, 2, 8)
    assert kernel.resolve_backend("auto", q) == "cpu_flash"
    assert kernel_name("auto", q) == "cpu_flash"
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        kernel.resolve_backend("cuda_sdpa", q)
    with pytest.raises(ValueError, match="unknown kernel backend 'xla'; valid backends"):
        kernel.resolve_backend("xla", q)
    meta = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16, device="meta")
    assert kernel_name("cuda_sdpa", meta, CAUSAL) == "cuda_sdpa/flash"
    assert kernel_name("cuda_sdpa", meta, DENSE) == "cuda_sdpa/efficient"
    assert kernel_name("cuda_sdpa", meta.float(), CAUSAL) == "cuda_sdpa/efficient"
    assert kernel_name("cuda_sdpa", meta[..., :12], FULL) == "cuda_sdpa/efficient"
    wide = torch.zeros(1, 4, 2, 256, dtype=torch.bfloat16, device="meta")  # flash's widest
    assert kernel_name("cuda_sdpa", wide, CAUSAL) == "cuda_sdpa/flash"
    # no CUDA SDPA kernel takes float64: the explicit CUDA backend sends it to the oracle
    assert kernel_name("cuda_sdpa", meta.double(), CAUSAL) == "torch"


def test_no_flash_backward_for_head_dims_193_to_224_on_sm86_89_and_sm120(monkeypatch):
    """flash-attn's mha_bwd runs 192 < D <= 224 on sm80/sm90 only (torch's dispatcher turns
    flash off there, but the shim calls the ops itself): those blocks take the other kernel."""
    import types

    def on(cap, d):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
        return kernel._head_dim_ok(types.SimpleNamespace(shape=(1, 4, 2, d),
                                                         device=torch.device("cuda", 0)))
    assert not any(on(cap, 200) for cap in ((8, 6), (8, 7), (8, 9), (12, 0), (12, 1)))
    assert not on((8, 9), 224)
    assert on((8, 0), 200) and on((9, 0), 224) and on((8, 6), 192) and on((8, 9), 256)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hk", [4, 2])
@pytest.mark.parametrize(("kind", "mask", "sq", "sk"), CASES)
@pytest.mark.parametrize("d", [64, 10])  # 10: padded to the efficient kernel's alignment
def test_cuda_sdpa_plumbing_on_meta(dtype, hk, kind, mask, sq, sk, d):
    q, k, v, do = _qkvd(sq, sk, hk=hk, d=d, dtype=dtype, device="meta")
    out, lse = block_forward(q, k, v, kind=kind, mask=mask, backend="cuda_sdpa")
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (2, 4, sq) and lse.dtype == torch.float32
    for given in (None, out):  # a stand-in, or the rows' own output
        grads = block_backward(do, q, k, v, lse, lse, kind=kind, mask=mask, backend="cuda_sdpa",
                               out_BSHD=given)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
        assert [g.dtype for g in grads] == [dtype] * 3


# ---------------------------------------------------------------------------------------------
# flash-attn: fakes with each release's signature, computing with the oracle


def _fa_math_fwd(q, k, v, softmax_scale, causal):
    assert q.shape[1] == k.shape[1] or not causal  # flash-attn is bottom-right otherwise
    return kernel._torch_fwd(q, k, v, softmax_scale, causal, None)


def _fa_math_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal):
    delta = (dout.double() * out.double()).sum(-1).transpose(1, 2)  # what the kernel does
    g = kernel._torch_bwd(dout, q, k, v, lse, delta, softmax_scale, causal, None)
    for dst, src in zip((dq, dk, dv), g, strict=True):
        dst.copy_(src)


def _fake_25():
    def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size,
                            alibi_slopes, return_softmax):
        assert dropout_p == 0 and tuple(window_size) == (-1, -1) and alibi_slopes is None
        out, lse = _fa_math_fwd(q, k, v, softmax_scale, causal)
        return out, q, k, v, out, lse, None, torch.zeros(2)

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                             softmax_scale, causal, window_size, alibi_slopes, deterministic,
                             rng_state=None):
        assert tuple(window_size) == (-1, -1)
        _fa_math_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)
        return dq, dk, dv, None

    return types.SimpleNamespace(_flash_attn_forward=_flash_attn_forward,
                                 _flash_attn_backward=_flash_attn_backward)


def _fake_26():
    def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                            alibi_slopes, return_softmax):
        assert softcap == 0.0 and tuple(window_size) == (-1, -1)
        out, lse = _fa_math_fwd(q, k, v, softmax_scale, causal)
        return out, q, k, v, out, lse, None, torch.zeros(2)

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                             softmax_scale, causal, window_size, softcap, alibi_slopes,
                             deterministic, rng_state=None):
        assert softcap == 0.0
        _fa_math_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)
        return dq, dk, dv, None

    return types.SimpleNamespace(_flash_attn_forward=_flash_attn_forward,
                                 _flash_attn_backward=_flash_attn_backward)


class _CustomOpLike:
    """Like torch.library's CustomOpDef: callable, the Python function kept in ``_init_fn``."""

    def __init__(self, fn):
        self._init_fn = fn

    def __call__(self, *args, **kwargs):
        return self._init_fn(*args, **kwargs)


def _fake_27():
    def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                            window_size_right, softcap, alibi_slopes, return_softmax):
        assert (window_size_left, window_size_right, softcap) == (-1, -1, 0.0)
        out, lse = _fa_math_fwd(q, k, v, softmax_scale, causal)
        return out, lse, None, torch.zeros(2)

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                             softmax_scale, causal, window_size_left, window_size_right, softcap,
                             alibi_slopes, deterministic, rng_state=None):
        _fa_math_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)
        return None

    return types.SimpleNamespace(_flash_attn_forward=_CustomOpLike(_flash_attn_forward),
                                 _flash_attn_backward=_CustomOpLike(_flash_attn_backward))


@pytest.mark.parametrize("fake", [_fake_25, _fake_26, _fake_27], ids=["2.5", "2.6", "2.7+"])
def test_flash_attn_versions_through_one_shim(monkeypatch, fake):
    module = fake()
    monkeypatch.setattr(kernel, "_flash_attn_module", lambda: module)
    kernel._fa_params.cache_clear()
    try:
        q, k, v, do = _qkvd(12, 12, dtype=torch.float32)
        for causal in (False, True):
            out, lse = kernel._flash_attn_fwd(q, k, v, 0.25, causal, None)
            ref_o, ref_l = kernel._torch_fwd(q, k, v, 0.25, causal, None)
            assert (out - ref_o).abs().max() < 1e-5 and (lse - ref_l).abs().max() < 1e-5
            delta = (do * ref_o).sum(-1).transpose(1, 2)
            got = kernel._flash_attn_bwd(do, q, k, v, ref_l, delta, 0.25, causal, None)
            want = kernel._torch_bwd(do, q, k, v, ref_l, delta, 0.25, causal, None)
            for a, b in zip(got, want, strict=True):
                assert (a - b).abs().max() < 1e-4  # the stand-in out gives the same delta
            got = kernel._flash_attn_bwd(do, q, k, v, ref_l, delta, 0.25, causal, None,
                                         out=ref_o)  # the rows' own output
            for a, b in zip(got, want, strict=True):
                assert (a - b).abs().max() < 1e-4
    finally:
        kernel._fa_params.cache_clear()


def test_flash_attn_is_asked_only_for_blocks_it_takes(monkeypatch):
    """backend='flash_attn' with the package present: fp32 and dense-mask blocks go to
    cuda_sdpa (flash-attn refuses fp32 and takes no dense mask); half-precision blocks stay."""
    monkeypatch.setattr(kernel, "_flash_attn_module", lambda: types.SimpleNamespace())
    q = torch.empty(1, 8, 2, 64, device="meta")
    half = q.to(torch.bfloat16)
    assert [kernel.resolve_backend("flash_attn", x, kind) for x, kind in (
        (q, kernel.FULL), (half, kernel.DENSE), (half, kernel.FULL), (half, kernel.CAUSAL))] == [
        "cuda_sdpa", "cuda_sdpa", "flash_attn", "flash_attn"]


def test_aten_calls_never_drop_a_meaningful_argument():
    """The shim calls aten ops by schema names; an argument the installed op lacks may be left
    out only at its neutral value, anything else is an error (not a silently different op)."""
    from burst.kernel import _aten

    q = torch.randn(1, 2, 8, 4)
    out = _aten("_scaled_dot_product_flash_attention_for_cpu", query=q, key=q, value=q,
                dropout_p=0.0, is_causal=False, not_in_any_torch=None)
    assert out[0].shape == q.shape
    with pytest.raises(RuntimeError, match="not_in_any_torch"):
        _aten("_scaled_dot_product_flash_attention_for_cpu", query=q, key=q, value=q,
              not_in_any_torch=0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_output_gradients_do_not_underflow(dtype):
    """The kernels that recompute D from (dO, out) get a stand-in out; with dO ~ 1e-22 its
    squared norm underflowed in fp32 and dq, dk came out wrong. Scaled: equal to the oracle."""
    from burst.kernel import block_backward, block_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 8, generator=g).to(dtype) for _ in range(3))
    do = (torch.randn(1, 16, 2, 8, generator=g) * 1e-22).to(dtype)
    out, lse = block_forward(q, k, v, backend="torch")
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    want = block_backward(do, q, k, v, lse, delta, backend="torch")
    got = block_backward(do, q, k, v, lse, delta, backend="cpu_flash")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for w, x in zip(want, got, strict=True):
        assert (x.float() - w.float()).abs().max() <= tol * w.float().abs().max()


def test_fp16_stand_in_keeps_the_spread_where_a_top_entry_overflows():
    """In fp16 the stand-in out puts D on a row's largest |dO| entries; with large values
    (|O| ~ 2e4) D / max|dO| exceeds fp16's 65504, so such a row keeps the spread stand-in
    (|out'| <= |O|, finite, same row sums against dO): an inf there made dq, dk NaN."""
    from burst.kernel import _stand_in_out, block_backward

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 16, 2, 8, generator=g).half() for _ in range(2))
    out = (2e4 + 100 * torch.randn(1, 16, 2, 8, generator=g)).half()
    do = (1 + 0.1 * torch.randn(1, 16, 2, 8, generator=g)).half()
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    stand_in = _stand_in_out(do, delta)
    assert stand_in.isfinite().all()
    sums = (do.float() * stand_in.float()).sum(-1).transpose(1, 2)
    assert ((sums - delta).abs() <= 1e-2 * delta.abs()).all()
    lse = torch.zeros(1, 2, 16)
    for grad in block_backward(do, q, k, out, lse, delta, backend="cpu_flash"):
        assert grad.isfinite().all()


def test_bf16_stand_in_drops_a_term_that_overflows_and_keeps_nan():
    """bf16 has fp32's range, so its stand-in builds no spread fallback (the burst backward
    builds one stand-in per visiting block: the fallback doubled its cost). A later term can
    still overflow where a tiny |dO| entry would carry the first one's rounding residue: it is
    dropped, leaving that residue (the spread's own error); a NaN delta stays NaN."""
    from burst.kernel import _stand_in_out

    do = torch.zeros(1, 2, 1, 8, dtype=torch.bfloat16)
    do[..., 0], do[..., 1], do[..., 2] = 1.0, 1e-40, 1e-40  # one entry, two subnormal ones
    delta = torch.tensor([[[1000.3, 0.5]]])  # B H S: 1000.3 is not a bf16 number, 0.5 is
    got = _stand_in_out(do, delta)
    assert got.isfinite().all()
    sums = (do.float() * got.float()).sum(-1).transpose(1, 2)
    assert abs(sums[0, 0, 0] - 1000.3) <= 2**-8 * 1000.3 and sums[0, 0, 1] == 0.5
    assert got[0, 0, 0, 1:].eq(0).all()  # the residue's terms overflowed: dropped
    nan = _stand_in_out(do, torch.tensor([[[float("nan"), 0.5]]]))
    assert nan[0, 0].isnan().any() and nan[0, 1].isfinite().all()


def test_the_ring_backward_builds_no_stand_in_and_the_burst_one_one_per_visit(monkeypatch):
    """Kernels that insist on ``out`` (here torch's CPU flash op) got a stand-in built from
    (dO, D) at every block of every ring step, in both backward schemes (7.8% of a 1024-token
    fp32 block backward on this CPU, 21% in bf16). The ring backward keeps its queries' own
    output, as every ring implementation passes it, and now hands it over; the burst backward's
    visiting rows bring D, not O, so it still builds one per visiting block."""
    from burst.emulate import emulate_attn

    calls = []
    real = kernel._stand_in_out
    monkeypatch.setattr(kernel, "_stand_in_out", lambda do, d: calls.append(1) or real(do, d))
    q, k, v, do = _qkvd(16, 16, hk=4, dtype=torch.float32)
    grads = {}
    for scheme in ("ring", "burst"):
        calls.clear()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = emulate_attn(*leaves, world=4, causal=False, layout="contiguous",
                           backward=scheme, backend="cpu_flash")
        out.backward(do)
        grads[scheme] = [t.grad for t in leaves]
        assert len(calls) == (0 if scheme == "ring" else 16), (scheme, len(calls))
    for a, b in zip(grads["ring"], grads["burst"], strict=True):
        assert (a - b).abs().max() < 1e-5


def test_a_refused_cudnn_block_falls_back_to_flash_for_good(monkeypatch):
    """A cuDNN graph that does not build turns the op off on that device, with one warning;
    running out of memory is not a refusal (it propagates, the op stays on)."""
    monkeypatch.setattr(kernel, "_CUDNN_OFF", set())
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(torch.OutOfMemoryError):
        kernel._cudnn_refused(q, torch.OutOfMemoryError("out of memory"))
    assert not kernel._CUDNN_OFF
    with pytest.warns(RuntimeWarning, match="cuDNN attention op refused a block on cpu"):
        kernel._cudnn_refused(q, RuntimeError("No valid execution plans built.\nmore"))
    assert {"cpu"} == kernel._CUDNN_OFF
    assert not kernel._sdpa_cudnn_ok(q, 2, FULL)


def test_cpu_flash_leaves_its_op_only_for_inputs_that_are_not_finite_or_may_overflow():
    """The op mishandles NaN and infinite inputs, so the cpu_flash backend gives those blocks
    to the oracle (tests/test_emulate.py); finite float16 whose float16 sum overflows stays on
    the op (a sum in the input dtype sent it to the oracle, the slow path); finite q and k
    whose scores may pass float32's range go to float64; an empty block is the op's."""
    ones = torch.ones(2, 4096, 2, 16, dtype=torch.float16)
    assert ones.sum().isinf() and kernel._route(ones, ones, 0.25) == kernel.OP
    for bad in (float("nan"), float("inf"), float("-inf")):
        k = ones.clone()
        k[1, 7, 0, 3] = bad
        assert kernel._route(ones, k, 0.25) == kernel.ORACLE, bad
    big = torch.full((1, 2, 1, 16), 1e18)  # 16 x 1e36 x 0.25 = 4e36: no overflow
    assert kernel._route(big, big, 0.25) == kernel.OP
    assert kernel._route(big, big * 100, 0.25) == kernel.FLOAT64  # 4e38 > 3.4e38
    assert kernel._route(big, big * 100, -0.25) == kernel.FLOAT64  # the bound takes |scale|
    assert kernel._route(big.double(), big.double() * 100, 0.25) == kernel.OP  # float64's
    # the op overflows on q.k before it scales: a small scale does not keep it in range
    assert kernel._route(big, big * 100, 1e-3) == kernel.FLOAT64
    # a scale over 1 takes scores that fit past the range: 16 x 1e37 fits, x 4 does not
    assert kernel._route(big, big * 10, 1.0) == kernel.OP
    assert kernel._route(big, big * 10, 4.0) == kernel.FLOAT64
    # the bound is the accumulation dtype's: float16 scores of 1.6e5 stay on the op
    half = torch.full((1, 2, 1, 16), 100.0, dtype=torch.float16)
    assert kernel._route(half, half, 1.0) == kernel.OP
    empty = torch.ones(0, 2, 1, 16)
    assert kernel._route(empty, empty, 0.25) == kernel.OP


def _products_overflow(sq=70, sk=90, sign=1.0, seed=0):
    """float32 q and k whose first terms' products, about 4e38, pass float32's range, while
    the scaled scores, about 1.5e38, do not (the softmax is one-hot on the largest); ``sign``
    -1: every score about -1.5e38."""
    q, k, v, do = _qkvd(sq=sq, sk=sk, h=2, hk=2, d=8, dtype=torch.float32, seed=seed)
    g = torch.Generator().manual_seed(seed)
    q[..., 0] = 2e19 * (1 + 0.1 * torch.rand(q.shape[:3], generator=g))
    k[..., 0] = sign * 2e19 * (1 + 0.1 * torch.rand(k.shape[:3], generator=g))
    return q, k, v, do


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize(("kind", "mask"), [(FULL, None), (CAUSAL, None),
                                            (DENSE, _mask(70, 90))])
def test_cpu_flash_blocks_whose_products_overflow_float32_run_in_float64(kind, mask, sign):
    """torch's CPU op gives such rows NaN and lse inf, or (scores all negative) out 0 and lse
    0, which a ring merges as a key of logit 0; the backend gives the float64 oracle's
    numbers, forward and backward (given a float64 lse: a float32 lse of 1.5e38 is off by
    up to 5e30, so exp(s - lse) is 0 or inf in any kernel; the ring test shows it loud)."""
    q, k, v, do = _products_overflow(sq=90 if kind == CAUSAL else 70, sign=sign)
    kw = dict(kind=kind) if mask is None else dict(kind=kind, mask=mask)
    for scale in (1e-3, None):  # a scale under 1 does not keep the op's q.k in range
        out, lse = block_forward(q, k, v, backend="cpu_flash", scale=scale, **kw)
        o64, l64 = block_forward(q.double(), k.double(), v.double(), backend="torch",
                                 scale=scale, **kw)
        assert (out.double() - o64).abs().max() < 1e-6, scale
    seen = l64.isfinite()
    assert torch.equal(lse.isfinite(), seen) and seen.sum() > 100
    assert ((lse.double()[seen] - l64[seen]) / l64[seen]).abs().max() < 1e-6
    assert l64[seen].abs().min() > 1e38
    delta = (do.double() * o64).sum(-1).transpose(1, 2)
    got = block_backward(do, q, k, v, l64, delta, backend="cpu_flash", **kw)
    want = block_backward(do.double(), q.double(), k.double(), v.double(), l64, delta,
                          backend="torch", **kw)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32 and a.isfinite().all()
        assert (a.double() - b).abs().max() <= 1e-6 * b.abs().max() + 1e-6


def test_a_block_whose_lse_passes_float32_is_an_error_not_a_masked_row():
    """A row whose every key scores below -3.4e38: torch's CPU op returns out 0 and lse 0 (a
    ring merged it as a key of logit 0: 0.11 off); its result cannot be stated in float32."""
    q, k, v, _ = _qkvd(sq=8, sk=8, h=2, hk=2, d=4, dtype=torch.float32)
    q[0, 3, 0] = torch.tensor([1e20, 0.0, 0.0, 0.0])
    k[0, :, 0, 0] = -1e20
    with pytest.raises(OverflowError, match=r"overflow torch.float32: a query's log-sum-exp "
                                            r"is -5e\+39, beyond 3.4e\+38 .*scale q or k down"):
        block_forward(q, k, v, backend="cpu_flash")
    # scores that fit float32 until a scale over 1 takes them past it: the op gave NaN
    q = torch.full((1, 4, 1, 16), 3e18)  # q.k 1.44e38, x 4: 5.8e38
    with pytest.raises(OverflowError, match=r"log-sum-exp is 5.76e\+38"):
        block_forward(q, q, q, backend="cpu_flash", scale=4.0)


@pytest.mark.parametrize(("kind", "mask"), [(FULL, None), (CAUSAL, None),
                                            (DENSE, _mask(150, 90))])
def test_float64_blocks_in_bounded_chunks_are_the_whole_blocks(monkeypatch, kind, mask):
    """The float64 route's forward and backward over chunks of 64 query rows (a long CPU
    shard) give the float64 oracle's numbers: dq by rows, dk and dv summed over the chunks;
    a bfloat16 block's out is bfloat16 and its lse float32, as the op's."""
    monkeypatch.setattr(kernel, "ORACLE_CHUNK_SCORES", 1)  # chunks of 64 rows: 3 here
    q, k, v, do = _products_overflow(sq=90 if kind == CAUSAL else 150)
    kw = dict(kind=kind) if mask is None else dict(kind=kind, mask=mask)
    o64, l64 = block_forward(q.double(), k.double(), v.double(), backend="torch", **kw)
    delta = (do.double() * o64).sum(-1).transpose(1, 2)
    got = block_backward(do, q, k, v, l64, delta, backend="cpu_flash", **kw)
    want = block_backward(do.double(), q.double(), k.double(), v.double(), l64, delta,
                          backend="torch", **kw)
    for a, b in zip(got, want, strict=True):
        assert (a.double() - b).abs().max() <= 1e-6 * b.abs().max() + 1e-6
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    assert kernel._route(qb, kb, 0.25) == kernel.FLOAT64
    out, lse = block_forward(qb, kb, vb, backend="cpu_flash", **kw)
    _, l64 = block_forward(qb.double(), kb.double(), vb.double(), backend="torch", **kw)
    seen = l64.isfinite()
    assert (out.dtype, lse.dtype) == (torch.bfloat16, torch.float32)
    assert torch.equal(lse.isfinite(), seen)
    assert ((lse.double()[seen] - l64[seen]) / l64[seen]).abs().max() < 1e-6


@pytest.mark.parametrize(("kind", "mask"), [(CAUSAL, None), (FULL, None),
                                            (DENSE, _mask(200, 200))])
def test_a_non_finite_block_is_the_oracles_in_bounded_chunks(monkeypatch, kind, mask):
    """A block with a NaN key and keys every query scores -inf: cpu_flash gives the oracle's
    numbers, NaN where it has NaN, also when the oracle runs in chunks of query rows (its
    memory bounded for a long CPU shard)."""
    q, k, v, _ = _qkvd(sq=200, sk=200, dtype=torch.float32)
    q, k = q.abs(), k.clone()
    k[0, 5, 1, 2] = float("nan")
    k[1, 7:9, :, 0] = float("-inf")
    kw = dict(kind=kind) if mask is None else dict(kind=kind, mask=mask)
    want = block_forward(q, k, v, backend="torch", **kw)
    for scores in (1 << 24, 1):  # whole, then chunks of 64 rows
        monkeypatch.setattr(kernel, "ORACLE_CHUNK_SCORES", scores)
        got = block_forward(q, k, v, backend="cpu_flash", **kw)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.isnan(), b.isnan()) and a.isnan().any()
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), scores
