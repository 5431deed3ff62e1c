"""GPU checks (issue 8): run on a CUDA machine by ``scripts/gpu_check.sh``; skipped elsewhere.

- the kernel shim on CUDA against the float64 oracle, every CUDA backend present, bf16 / fp16 /
  fp32, every block kind (a dense mask with a row that sees nothing), GQA;
- the multi-rank BurstAttention algorithm on one GPU through the emulation: every layout, causal,
  window and documents, both backward schemes, the double ring;
- ``burst_attn`` itself on CUDA (one rank, autograd) and the absence of host syncs in ring steps;
- the engine's tiny model on CUDA: same loss as on CPU, every checkpointing mode.
Tolerances follow flash-attention's rule (DESIGN/STYLE) for single kernels: at most twice the
max error of a plain PyTorch implementation in the same dtype, plus a small floor for fp32
kernels that may use TF32. Whole rings round each block's partial result to the input dtype, so
their max error is held to ``RING_MAX`` x the plain one's (burst/reference.py, tests/parity.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from burst import burst_attn, kernel
from burst.emulate import emulate_attn
from burst.kernel import available_backends, block_backward, block_forward, kernel_name
from burst.layout import LAYOUTS
from burst.masks import CAUSAL, DENSE, FULL
from burst.reference import naive_attention, reference_attention
from tests.parity import RING_MAX

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FLOOR = {torch.bfloat16: 2e-3, torch.float16: 5e-4, torch.float32: 2e-3}  # TF32 in fp32 kernels
LSE_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 2e-3}
CUDA = "cuda"


def _inputs(b, n, h, hk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, n, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, n, hk, d, generator=g, dtype=torch.float64)
    do = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    return [t.to(CUDA) for t in (q, k, v, do)]


def _err(a, b):
    a, b = a.detach().double(), b.detach().double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    return float(torch.where(both_inf, torch.zeros_like(a), (a - b).abs()).max())


def _grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    res = fn(*leaves)
    out, lse = res if isinstance(res, tuple) else (res, None)
    out.backward(do)
    return out.detach(), lse, *(t.grad for t in leaves)


def _cuda_backends():
    return [b for b in available_backends() if b in ("cuda_sdpa", "flash_attn")]


# ---------------------------------------------------------------------------------------------
# the kernel shim


def _block_case(kind, sq, sk):
    if kind == DENSE:
        m = torch.rand(sq, sk, generator=torch.Generator().manual_seed(1)) > 0.3
        m[5] = False  # a row that sees no key
        return m
    return None


@pytest.mark.parametrize("backend", ["cuda_sdpa", "flash_attn"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("h", "hk", "d"), [(8, 8, 128), (8, 2, 64), (4, 2, 36), (4, 4, 10)])
def test_kernel_shim_matches_reference(backend, dtype, h, hk, d):
    """Head dims 36 and 10 reach the memory-efficient op, whose sm80+ kernels need head_dim
    aligned to 128 bits: the shim zero-pads them."""
    if backend not in _cuda_backends():
        pytest.skip(f"backend {backend} is not installed here")
    failures = []
    for kind, sq, sk in ((FULL, 256, 192), (CAUSAL, 256, 256), (DENSE, 256, 200)):
        mask = _block_case(kind, sq, sk)
        q, k, v, do = _inputs(2, max(sq, sk), h, hk, d, seed=sq + sk)
        q, do, k, v = q[:, :sq], do[:, :sq], k[:, :sk], v[:, :sk]
        ref_o, ref_l = block_forward(q, k, v, kind=kind, mask=mask, backend="torch")
        delta = (do * ref_o).sum(-1).transpose(1, 2)
        ref_g = block_backward(do, q, k, v, ref_l, delta, kind=kind, mask=mask, backend="torch")
        lq, lk, lv, ldo = (t.to(dtype) for t in (q, k, v, do))
        out, lse = block_forward(lq, lk, lv, kind=kind, mask=mask, backend=backend)
        l_delta = (ldo.float() * out.float()).sum(-1).transpose(1, 2)
        got_g = block_backward(ldo, lq, lk, lv, lse, l_delta, kind=kind, mask=mask,
                               backend=backend)
        # naive same-dtype implementation through autograd (the tolerance baseline)
        vis = None if mask is None else mask.to(CUDA)
        if kind == CAUSAL:
            vis = torch.ones(sq, sk, dtype=torch.bool, device=CUDA).tril()
        nv = _grads(lambda a, b_, c, m=vis: _naive_masked(a, b_, c, m), lq, lk, lv, ldo)
        name = f"{kernel_name(backend, lq, kind, kv_heads=hk)} {kind} {dtype} H={h}/{hk} d={d}"
        e_out, n_out = _err(out, ref_o), _err(nv[0], ref_o)
        if not e_out <= 2 * n_out + FLOOR[dtype]:
            failures.append(f"{name}: out {e_out:.3g} vs naive {n_out:.3g}")
        if _err(lse, ref_l) > LSE_TOL[dtype]:
            failures.append(f"{name}: lse {_err(lse, ref_l):.3g}")
        if not torch.equal(torch.isneginf(lse), torch.isneginf(ref_l)):
            failures.append(f"{name}: rows without keys must have lse -inf")
        for gname, a, ref, naive in zip(("dq", "dk", "dv"), got_g, ref_g, nv[2:], strict=True):
            if not torch.isfinite(a).all():
                failures.append(f"{name}: {gname} not finite")
                continue
            e, n = _err(a, ref), _err(naive, ref)
            if not e <= 2 * n + FLOOR[dtype] * 4:
                failures.append(f"{name}: {gname} {e:.3g} vs naive {n:.3g}")
    assert not failures, "\n".join(failures)
    assert not kernel._CUDNN_OFF, f"the cuDNN op refused a block on {kernel._CUDNN_OFF}"


def test_float64_on_cuda_takes_the_torch_kernel():
    """No CUDA SDPA or flash-attn kernel takes float64: ``auto`` and either GPU backend run a
    float64 block on the torch one (the CPU suite cannot reach this branch: a mutation audit)."""
    q = torch.zeros(1, 128, 2, 64, dtype=torch.float64, device=CUDA)
    for backend in ("auto", *_cuda_backends()):
        assert kernel.resolve_backend(backend, q, CAUSAL) == "torch", backend
    assert kernel.resolve_backend("auto", q.float(), CAUSAL) != "torch"


def test_cudnn_runs_mha_blocks_on_hopper():
    """On sm90+ an MHA half-precision block runs on cuDNN (1.7x flash on an H200), a GQA one
    on flash; the numerics are test_kernel_shim_matches_reference's (H=8/8 d=128 is cuDNN)."""
    q = torch.zeros(1, 64, 8, 128, dtype=torch.bfloat16, device=CUDA)
    want = "cudnn" if torch.cuda.get_device_capability() >= (9, 0) else "flash"
    assert kernel_name("cuda_sdpa", q, CAUSAL) == f"cuda_sdpa/{want}"
    assert kernel_name("cuda_sdpa", q, FULL, kv_heads=2) == "cuda_sdpa/flash"
    assert kernel_name("cuda_sdpa", q, DENSE) == "cuda_sdpa/efficient"
    assert kernel_name("cuda_sdpa", q.float(), CAUSAL) == "cuda_sdpa/efficient"


def _naive_masked(q, k, v, vis):
    g = q.shape[2] // k.shape[2]
    s = (q.transpose(1, 2) @ k.transpose(1, 2).repeat_interleave(g, 1).transpose(-1, -2))
    s = s * q.shape[-1] ** -0.5
    p = torch.softmax(s.float() if vis is None else s.float().masked_fill(~vis, -1e30), -1)
    if vis is not None:  # rows that see no key: no output, no gradient (never NaN)
        p = p * vis.any(-1, keepdim=True)
    return (p.to(q.dtype) @ v.transpose(1, 2).repeat_interleave(g, 1)).transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# the multi-rank algorithm, emulated on one GPU


def _emulated_case(world, dtype, mask_kw, **kw):
    q, k, v, do = _inputs(1, 128 * world, 8, 4, 64, seed=world)
    ref = _grads(lambda a, b_, c: reference_attention(a, b_, c, **mask_kw), q, k, v, do)
    low = [t.to(dtype) for t in (q, k, v, do)]
    got = _grads(lambda a, b_, c: emulate_attn(a, b_, c, world=world, return_lse=True,
                                               **mask_kw, **kw), *low)
    naive = _grads(lambda a, b_, c: naive_attention(a, b_, c, **mask_kw), *low)
    out = {}
    for i, name in ((0, "out"), (2, "dq"), (3, "dk"), (4, "dv")):
        out[name] = (_err(got[i], ref[i]), _err(naive[i], ref[i]))
    out["lse"] = (_err(got[1], ref[1]), 0.0)
    return out


def _ring_factor(dtype) -> float:
    """Max-error factor of a whole ring: RING_MAX where block results are rounded to a 16-bit
    dtype, flash-attention's 2 in float32 (these GPU checks compare max errors only)."""
    return RING_MAX if dtype in (torch.bfloat16, torch.float16) else 2.0


def test_emulated_burst_attention_every_layout_and_mask():
    docs = (0, 100, 333, 512)
    masks = {"causal": dict(causal=True), "full": dict(causal=False),
             "window": dict(causal=True, window=(150, 0)),
             "docs": dict(causal=True, cu_seqlens=docs)}
    failures = []
    for dtype in (torch.bfloat16, torch.float32):
        for layout in LAYOUTS:
            for mname, mask_kw in masks.items():
                for backward in ("burst", "ring"):
                    errs = _emulated_case(4, dtype, mask_kw, layout=layout, backward=backward)
                    for name, (e, n) in errs.items():
                        tol = (LSE_TOL[dtype] if name == "lse"
                               else _ring_factor(dtype) * n + 4 * FLOOR[dtype])
                        if not e <= tol:
                            failures.append(f"{dtype} {layout} {mname} {backward} {name}: "
                                            f"{e:.3g} (naive {n:.3g})")
    assert not failures, "\n".join(failures[:30])


def test_emulated_tiled_plans(monkeypatch):
    """Windows and documents split into small tiles: DENSE tiles reach the kernel as key bounds
    and their masks are built on the device; mask-free pieces go to the flash kernels."""
    import burst.masks

    monkeypatch.setattr(burst.masks, "TILE", 64)
    monkeypatch.setattr(burst.masks, "DOC_CUT_MIN", 32)
    masks = {"window": dict(causal=True, window=(150, 0)),
             "window2": dict(causal=False, window=(70, 90)),
             "docs": dict(causal=True, cu_seqlens=(0, 100, 333, 345, 512))}
    failures = []
    for dtype in (torch.bfloat16, torch.float32):
        for layout in LAYOUTS:
            for mname, mask_kw in masks.items():
                errs = _emulated_case(4, dtype, mask_kw, layout=layout, backward="burst")
                for name, (e, n) in errs.items():
                    tol = (LSE_TOL[dtype] if name == "lse"
                           else _ring_factor(dtype) * n + 4 * FLOOR[dtype])
                    if not e <= tol:
                        failures.append(f"{dtype} {layout} {mname} {name}: {e:.3g} (naive {n:.3g})")
    assert not failures, "\n".join(failures[:30])


@pytest.mark.parametrize(("world", "rpn"), [(8, 4), (8, 2)])
def test_emulated_double_ring(world, rpn):
    for backward in ("burst", "ring"):
        errs = _emulated_case(world, torch.bfloat16, dict(causal=True), layout="zigzag",
                              backward=backward, ranks_per_node=rpn)
        for name, (e, n) in errs.items():
            tol = (LSE_TOL[torch.bfloat16] if name == "lse"
                   else RING_MAX * n + 4 * FLOOR[torch.bfloat16])
            assert e <= tol, (backward, name, e, n)


def test_burst_attn_one_rank_on_cuda():
    q, k, v, do = _inputs(2, 512, 8, 2, 128, seed=11)
    ref = _grads(lambda a, b_, c: reference_attention(a, b_, c, causal=True), q, k, v, do)
    low = [t.to(torch.bfloat16) for t in (q, k, v, do)]
    got = _grads(lambda a, b_, c: burst_attn(a, b_, c, causal=True, return_lse=True), *low)
    naive = _grads(lambda a, b_, c: naive_attention(a, b_, c, causal=True), *low)
    for i in (0, 2, 3, 4):
        assert _err(got[i], ref[i]) <= 2 * _err(naive[i], ref[i]) + 4 * FLOOR[torch.bfloat16]
    assert got[0].device.type == "cuda" and got[1].dtype == torch.float32


@pytest.mark.parametrize(("layout", "window"), [("zigzag", None), ("contiguous", (300, 0))])
def test_ring_steps_never_sync_the_host(monkeypatch, layout, window):
    """Per-step work must not wait for the GPU (no .item(), no host reads of device tensors):
    torch's sync debug mode turns any synchronising call into an error. Tiles of 128 make the
    windowed case send DENSE tiles as key bounds."""
    import burst.masks
    from burst.emulate import RingEmulator

    monkeypatch.setattr(burst.masks, "TILE", 128)

    q, k, v, do = (t.to(torch.bfloat16) for t in _inputs(1, 2048, 8, 8, 64, seed=3))
    em = RingEmulator(q, k, v, world=4, causal=True, layout=layout, window=window)
    em.forward()  # warm-up: first-use allocations, pinned buffers
    state = em.new_forward_state()
    bstate = em.new_backward_state(do)
    calls = [c for r in range(4) for _, c in em.forward_calls(r, state)]
    calls += [c for r in range(4) for _, c in em.backward_calls(r, bstate, "burst")]
    assert len(calls) >= 8  # the check below is vacuous without calls to run
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# the engine's tiny model


def test_engine_tiny_model_on_cuda():
    from burst.engine import trainer as engine
    from burst.engine.configs import get_config

    cfg = get_config("tiny")

    def losses(device, mode, steps=2):
        tr = engine.Trainer(cfg, attention_options={"layout": "striped"}, checkpointing=mode,
                            device=device, dtype=torch.float32, seed=0)
        batch = tr.local_batch(seq_len=256, seed=1)
        return [tr.step(*batch) for _ in range(steps)]

    cpu = losses("cpu", "none")
    for mode in ("none", "full", "selective", "selective_half"):
        gpu = losses(CUDA, mode)
        for a, b in zip(gpu, cpu, strict=True):
            assert abs(a - b) <= 1e-3 * abs(b), (mode, gpu, cpu)  # TF32 matmuls allowed
    tr = engine.Trainer(cfg, attention_options={"layout": "zigzag"}, device=CUDA,
                        dtype=torch.bfloat16, checkpointing="selective")
    batch = tr.local_batch(seq_len=512, seed=2)
    first = tr.step(*batch)
    for _ in range(5):
        last = tr.step(*batch)
    assert torch.isfinite(torch.tensor(last)) and last < first, (first, last)
    # whole sequences from a CPU loader: shard_batch returns them on the Trainer's device, and
    # global_targets counts CPU targets too (its all-reduce under NCCL takes no CPU tensor)
    full = [torch.randint(0, cfg.vocab_size, (1, 512)) for _ in range(2)]
    shards = tr.shard_batch(*full, torch.arange(512).unsqueeze(0))
    assert all(t.device.type == "cuda" for t in shards), [t.device for t in shards]
    assert tr.global_targets(full[1]) == tr.global_targets(shards[1]) == 512
    assert math.isfinite(tr.step(*shards))


def test_every_method_over_nccl():
    """The only GPU test with more than one process: the ring and collective methods over
    NCCL between GPUs (every other test here runs one process and sends nothing)."""
    from burst.spawn import spawn
    from tests.parity import transport_check

    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"NCCL between ranks needs 2 or more GPUs; this machine has {gpus}")
    world = 4 if gpus >= 4 else 2
    for errs in spawn(transport_check, world, args=("cuda",), backend="nccl", timeout_s=300):
        assert len(errs) == (10 if world == 4 else 7), errs  # sub-groups need 4 ranks
        assert max(errs.values()) < 1e-2, errs  # fp32 kernels may round through TF32


def _reserved_gib(rank: int, world: int) -> tuple[float, float]:
    """mem_reserved_bytes (GiB) of one cell without and then with the reference check (a
    bf16 cell: the check also runs a plain bf16 attention on the GPU, whose results it once
    subtracted from the method's on the host: a device mismatch, found by reading)."""
    import dataclasses

    from suites.measure import measure
    from suites.simulate import as_cell

    cell = as_cell(dict(workload="attention", method="burst", seq_len=4096, world=1, heads=32,
                        kv_heads=4, head_dim=128, dtype="bfloat16", device="cuda"))
    out = []
    for check in (False, True):  # unchecked first: the check empties the cache before it
        row = measure(dataclasses.replace(cell, compute_error=check, warmup=1, repeats=2))
        assert row["status"] == "ok", row.get("error")
        if check:
            assert math.isfinite(row["max_err"]) and row["max_err_ratio"] > 0, row
        out.append(row["mem_reserved_bytes"] / 2**30)
    return tuple(out)


def test_the_reference_check_does_not_enter_reserved_memory():
    """The float64 reference (its freed blocks still reserved when the peak was reset) entered
    mem_reserved_bytes: about 4 GiB more with 8 query heads per kv head at 4K tokens."""
    from burst.spawn import spawn

    ((plain, checked),) = spawn(_reserved_gib, 1, backend="nccl", timeout_s=300)
    assert checked <= plain * 1.1 + 0.05, f"reserved GiB: {checked} checked, {plain} plain"


def test_training_script_saves_and_resumes_on_cuda(tmp_path):
    """scripts/train.py on one GPU (NCCL, CUDA tensors in the saved state): a run stopped at
    step 2 and resumed ends with the losses of one never stopped (float64: losing AdamW's
    moments moves step 3 by ~1e-3, far above kernels' atomics); in one file, and as
    torch.distributed.checkpoint's shards (--sharded-state). One straight run serves both
    (each launch starts CUDA and NCCL: about 16 s of the GPU check's tests section)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent

    def train(out, steps, *flags):
        res = subprocess.run([sys.executable, str(root / "scripts" / "train.py"), "--out",
                              str(out), "--device", "cuda", "--world", "1", "--seq-len", "256",
                              "--dtype", "float64",
                              "--steps", str(steps), "--save-every", "2", *flags],
                             cwd=root, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        return [json.loads(line)["loss"] for line in (out / "steps.jsonl").open()]

    want = train(tmp_path / "straight", 4)
    assert len(want) == 4 and want[-1] < want[0], want
    for flags in ((), ("--sharded-state",)):
        out = tmp_path / ("resumed" + "".join(flags))
        train(out, 2, *flags)
        got = train(out, 4, *flags)
        assert len(got) == 4, (flags, got)
        assert max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True)) < 1e-9, \
            (flags, got, want)
