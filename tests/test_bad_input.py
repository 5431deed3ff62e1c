"""burst_attn rejects bad input with a ValueError naming the value and the rule (issue 2)."""

from __future__ import annotations

import pytest
import torch

from burst import burst_attn
from burst.kernel import block_forward


def _qkv(s=8, h=4, hk=4, d=8, dtype=torch.float32):
    return (torch.randn(1, s, h, d, dtype=dtype), torch.randn(1, s, hk, d, dtype=dtype),
            torch.randn(1, s, hk, d, dtype=dtype))


@pytest.mark.parametrize(
    ("kwargs", "qkv", "match"),
    [
        ({"layout": "zigzag"}, dict(s=7), "local sequence length 7 is not divisible by 2"),
        ({}, dict(h=4, hk=3), "4 query heads are not divisible by 3 kv heads; valid kv head"),
        ({"layout": "diagonal"}, {}, "unknown layout 'diagonal'; valid layouts"),
        ({"backward": "reverse"}, {}, "unknown backward 'reverse'; valid: auto, burst, ring"),
        ({"backend": "triton"}, {}, "unknown kernel backend 'triton'; valid"),
        ({"ranks_per_node": 0}, {}, "not divisible by ranks_per_node=0; valid values: 1"),
        ({"window": (-1, 0), "causal": True}, {}, r"window=\(-1, 0\)"),
        ({"cu_seqlens": (0, 3, 9), "causal": True}, {}, "cu_seqlens ends at 9"),
        ({"cu_seqlens": (0, 5, 3, 8)}, {}, "strictly increasing"),
    ],
)
def test_bad_arguments(kwargs, qkv, match):
    with pytest.raises(ValueError, match=match):
        burst_attn(*_qkv(**qkv), **kwargs)


def test_mismatched_tensors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dtypes differ"):
        burst_attn(q, k.double(), v)
    with pytest.raises(ValueError, match="devices differ"):
        burst_attn(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="must have the same shape"):
        burst_attn(q, k, v[:, :, :2])
    with pytest.raises(ValueError, match="must agree in batch"):
        burst_attn(q, torch.randn(2, 8, 4, 8), torch.randn(2, 8, 4, 8))
    with pytest.raises(ValueError, match="expected 4 dims"):
        burst_attn(q[0], k, v)
    with pytest.raises(ValueError, match="floating dtype"):
        burst_attn(*(t.to(torch.int64) for t in (q, k, v)))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        burst_attn(q.numpy(), k, v)


def test_local_attention_and_dense_blocks_reject_bad_masks():
    from baselines.local_attention import local_attention
    from burst.masks import DENSE, MaskSpec

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="cu_seqlens ends at 6"):
        local_attention(q, k, v, spec=MaskSpec(causal=True, cu_seqlens=(0, 3, 6)), scale=1.0)
    bounds = (torch.zeros(8, dtype=torch.int32), torch.full((8,), 8, dtype=torch.int32))
    for kw in ({}, {"mask": torch.ones(8, 8, dtype=torch.bool), "bounds": bounds}):
        with pytest.raises(ValueError, match="exactly one of mask= and bounds="):
            block_forward(q, k, v, kind=DENSE, **kw)


def test_single_rank_equals_reference_and_gqa_kernel():
    from burst.reference import reference_attention

    q, k, v = _qkv(h=4, hk=2, dtype=torch.float64)
    out = burst_attn(q, k, v, causal=True, layout="striped")
    ref, _ = reference_attention(q, k, v, causal=True)
    assert torch.allclose(out, ref, atol=1e-12)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        block_forward(q, k, v, backend="cudnn-ish")
