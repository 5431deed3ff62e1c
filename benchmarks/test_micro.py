"""Micro-benchmarks of the hot paths (pytest-benchmark).

Run: ``make bench`` (timed, saved per machine class) or, as CI does, in quick mode where every
benchmark runs once as a smoke test (``--benchmark-disable``). Sizes are CPU-sized; on a GPU
machine set BENCH_DEVICE=cuda and BENCH_SCALE to grow them.
"""

from __future__ import annotations

import os

import pytest
import torch

from burst.kernel import acc_dtype, block_backward, block_forward
from burst.masks import CAUSAL, FULL
from burst.merge import merge_into, new_accumulators, row_delta

DEVICE = os.environ.get("BENCH_DEVICE", "cpu")
SCALE = int(os.environ.get("BENCH_SCALE", "1"))
S, H, D = 1024 * SCALE, 8, 64


def _qkv(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, S, H, D, generator=g, dtype=dtype).to(DEVICE) for _ in range(4)]


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("backend", ["torch", "cpu_flash"] if DEVICE == "cpu" else ["cuda_sdpa"])
@pytest.mark.parametrize("kind", [FULL, CAUSAL])
def test_kernel_forward(benchmark, backend, kind):
    q, k, v, _ = _qkv()

    def run():
        out = block_forward(q, k, v, kind=kind, backend=backend)
        _sync()
        return out

    out, lse = benchmark(run)
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("backend", ["torch", "cpu_flash"] if DEVICE == "cpu" else ["cuda_sdpa"])
def test_kernel_backward(benchmark, backend):
    q, k, v, do = _qkv()
    out, lse = block_forward(q, k, v, kind=CAUSAL, backend=backend)
    delta = row_delta(do, out, acc_dtype(q.dtype))

    def run():
        g = block_backward(do, q, k, v, lse, delta, kind=CAUSAL, backend=backend)
        _sync()
        return g

    dq, dk, dv = benchmark(run)
    assert torch.isfinite(dq).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_stand_in_out(benchmark, dtype):
    """The out the burst backward builds per visiting block for kernels that recompute D from
    (dO, out): 16-bit from the top |dO| entries, float32 spread over the row."""
    from burst.kernel import _stand_in_out

    q, k, v, do = _qkv(dtype)
    out, _ = block_forward(q, k, v, kind=FULL)
    delta = row_delta(do, out, acc_dtype(dtype))

    def run():
        o = _stand_in_out(do, delta)
        _sync()
        return o

    got = benchmark(run)
    sums = (do.float() * got.float()).sum(-1).transpose(1, 2)
    assert (sums - delta).abs().max() <= 1e-4 * delta.abs().max()


def test_lse_merge(benchmark):
    q, k, v, _ = _qkv()
    o1, l1 = block_forward(q, k, v, kind=FULL)
    o2, l2 = block_forward(q, v, k, kind=FULL)

    def run():
        out, lse = new_accumulators(q, torch.float32)
        merge_into(out, lse, o1, l1)
        merge_into(out, lse, o2, l2)
        _sync()
        return out, lse

    out, lse = benchmark(run)
    assert torch.allclose(lse, torch.logaddexp(l1, l2), atol=1e-5)


def test_ring_step_forward(benchmark):
    """One ring step of the zigzag forward as the schedule runs it: plan, kernel, merge."""
    from burst.masks import MaskSpec, plan_pair

    q, k, v, _ = _qkv()
    spec = MaskSpec(causal=True)
    out, lse = new_accumulators(q, torch.float32)

    def run():
        for c in plan_pair(spec, "zigzag", 4, 2, 1, S):
            o, l_ = block_forward(q[:, c.q], k[:, c.k], v[:, c.k], kind=c.kind, bounds=c.bounds)
            merge_into(out, lse, o, l_, rows=c.q)
        _sync()

    benchmark(run)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_lm_head_and_loss(benchmark, fused):
    """The LM head + cross-entropy, forward and backward: fused (chunks of logits) or plain."""
    from burst.engine.fused_loss import fused_linear_cross_entropy, plain_cross_entropy

    g = torch.Generator().manual_seed(0)
    t, e, vocab = 1024 * SCALE, 256, 8192
    hid = torch.randn(t, e, generator=g).to(DEVICE).requires_grad_()
    w = (torch.randn(vocab, e, generator=g) * 0.02).to(DEVICE).requires_grad_()
    tgt = torch.randint(0, vocab, (t,), generator=g).to(DEVICE)
    loss_fn = fused_linear_cross_entropy if fused else plain_cross_entropy

    def run():
        hid.grad = w.grad = None
        loss = loss_fn(hid, w, tgt)
        loss.backward()
        _sync()
        return loss

    loss = benchmark(run)
    assert torch.isfinite(loss) and torch.isfinite(hid.grad).all()


@pytest.mark.parametrize("mode", ["none", "selective"])
def test_engine_layer(benchmark, mode):
    """One decoder layer of the engine (single rank, BurstAttention), forward and backward,
    without checkpointing and with selective checkpointing (its recompute around the cache)."""
    from burst.engine import CausalLM, ModelConfig
    from burst.engine.checkpointing import run_layer
    from burst.engine.model import rope_cos_sin

    cfg = ModelConfig(hidden_size=H * D, num_layers=1, num_heads=H, num_kv_heads=H // 2,
                      ffn_size=2 * H * D, vocab_size=256)
    model = CausalLM.build(cfg, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, S, cfg.hidden_size, generator=g).to(DEVICE).requires_grad_()
    rope = rope_cos_sin(torch.arange(S, device=DEVICE)[None], cfg.head_dim, cfg.rope_theta,
                        x.dtype)

    def run():
        x.grad = None
        out = run_layer(model.layers[0], 0, x, rope, attention=model.attention, mode=mode,
                        cache=model.cache)
        out.sum().backward()
        _sync()
        return out

    out = benchmark(run)
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
