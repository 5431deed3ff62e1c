"""burst_attn rejects bad input with a ValueError naming the value and the rule (issue 2)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

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
        ({"ranks_per_node": 0}, {}, r"ranks_per_node must be a whole number >= 1 \(or None\), "
                                   "got 0"),
        ({"ranks_per_node": True}, {}, "got True"),  # a bool is not a ring size
        ({"ranks_per_node": 2.0}, {}, "got 2.0"),
        ({"window": (-1, 0), "causal": True}, {}, r"window=\(-1, 0\)"),
        ({"cu_seqlens": (0, 3, 9), "causal": True}, {}, "cu_seqlens ends at 9"),
        ({"cu_seqlens": (0, 5, 3, 8)}, {}, "non-decreasing"),
        ({"cu_seqlens": (0, 0)}, {}, "non-decreasing"),  # documents of no token at all
        ({"causal": True, "layout": "zigzag"}, dict(s=0), "local sequence length 0"),  # SIGFPE
        # malformed masks were TypeErrors, or silently truncated (1.7 -> 1, 5.5 -> 5)
        ({"window": 3}, {}, "window=3: expected"),
        ({"window": (None, 0)}, {}, r"window=\(None, 0\)"),
        ({"window": (1.7, 0)}, {}, "two whole numbers of tokens"),
        ({"window": (True, 0)}, {}, "two whole numbers of tokens"),
        ({"cu_seqlens": torch.tensor([[0, 5, 8]])}, {}, "one dimension of non-decreasing"),
        ({"cu_seqlens": (0, 5.5, 8)}, {}, "whole-number boundaries"),
        # torch's CPU flash kernel returns NaN for causal blocks at scale <= 0
        ({"softmax_scale": 0.0, "causal": True}, {}, "softmax_scale=0.0 must be a positive"),
        ({"softmax_scale": -0.5}, {}, "must be a positive finite number"),
        ({"softmax_scale": float("nan")}, {}, "must be a positive finite number"),
        ({}, dict(d=0), "head_dim must be >= 1"),
        # a set iterates in its own order: {5, 0} ran as the window (0, 5), sides swapped
        ({"window": {5, 0}, "causal": True}, {}, "window=.*expected"),
        ({"cu_seqlens": {0: 1, 3: 1, 8: 1}}, {}, "non-decreasing"),  # a dict ran as its keys
        ({"cu_seqlens": frozenset({0, 8})}, {}, "non-decreasing"),  # iterates 0, 8: it was accepted
        # float() took a tensor that requires grad and dropped its gradient without a word
        ({"softmax_scale": torch.tensor(0.3, requires_grad=True)}, {}, "requires grad"),
    ],
)
def test_bad_arguments(kwargs, qkv, match):
    with pytest.raises(ValueError, match=match):
        burst_attn(*_qkv(**qkv), **kwargs)


def test_a_numpy_ranks_per_node_is_a_ring_size():
    import numpy as np

    q, k, v = _qkv()
    assert torch.equal(burst_attn(q, k, v, causal=True, ranks_per_node=np.int64(1)),
                       burst_attn(q, k, v, causal=True))


def test_whole_number_masks_in_any_spelling_are_accepted():
    """inf (or >= 2**40) is an unbounded side; integral floats, numpy and 0-dim tensor ints and a
    1-D tensor of boundaries mean what they say."""
    import numpy as np

    from burst.masks import MaskSpec

    assert MaskSpec(window=(float("inf"), 2.0)).window == (1 << 40, 2)
    assert MaskSpec(window=(np.float32("inf"), torch.tensor(float("inf")))).window == (1 << 40,
                                                                                       1 << 40)
    assert MaskSpec(window=(np.array(np.inf), np.array(3))).window == (1 << 40, 3)
    assert MaskSpec(window=(np.int64(3), torch.tensor(1))).window == (3, 1)
    assert MaskSpec(cu_seqlens=torch.tensor([0, 5, 8])).cu_seqlens == (0, 5, 8)
    assert MaskSpec(cu_seqlens=[0, 5.0, np.int32(8)]).cu_seqlens == (0, 5, 8)
    q, k, v = _qkv()
    assert torch.equal(burst_attn(q, k, v, causal=True, window=(float("inf"), 0)),
                       burst_attn(q, k, v, causal=True))


def test_every_registry_method_rejects_a_bad_scale():
    from baselines import registry

    q, k, v = _qkv()
    for name in registry.names():
        with pytest.raises(ValueError, match="softmax_scale=-1.0 must be a positive"):
            registry.get(name)(q, k, v, causal=True, softmax_scale=-1.0)


def test_every_registry_method_rejects_a_non_bool_causal_empty_shards_and_unknown_options():
    """causal="no" ran causal, and allgather / ulysses took 0 tokens per rank, without an error;
    a misspelt option was a bare TypeError (the one-process world; a bad value is refused
    before any communication)."""
    from baselines import registry

    q, k, v = _qkv()
    empty = _qkv(s=0)
    for name in registry.names(level="core"):  # the GPU packages' adapters too
        with pytest.raises(ValueError, match="causal='no': expected True or False"):
            registry.get(name)(q, k, v, causal="no")
        if registry.get(name).unavailable():
            continue
        one = {"ulysses_degree": 1} if name == "usp" else {}  # its default needs 2 ranks
        with pytest.raises(ValueError, match="local sequence length 0"):
            registry.get(name)(*empty, causal=True, **one)
        with pytest.raises(ValueError, match=f"method {name!r} has no option 'lyout'; valid "):
            registry.get(name)(q, k, v, causal=True, lyout="zigzag", **one)


def test_a_method_refuses_dtypes_it_does_not_compute_in():
    """The registry entry's dtypes (flash-attn packages: 16-bit) are checked by the one shared
    call check, here and on a GPU alike, and by the harness's cell check."""
    from baselines import registry
    from baselines.checks import check_call

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="computes in float16 or bfloat16, got float32"):
        check_call(registry.get("ring_flash_attn"), q, k, v, causal=True, group=None,
                   options={"layout": "zigzag"})
    # a dtypes rule may answer None (any float) or one name
    import dataclasses

    ring = registry.get("ring")
    assert dataclasses.replace(ring, dtypes=lambda **_: None).dtypes_for({}) is None
    assert dataclasses.replace(ring, dtypes=lambda **_: "bfloat16").dtypes_for() == ("bfloat16",)
    # ring-flash-attn's contiguous ring (and yunchang's, the same code) returns dq in bf16
    half = [t.half() for t in (q, k, v)]
    for name, opts in (("ring_flash_attn", {"layout": "contiguous"}), ("yunchang", {})):
        with pytest.raises(ValueError, match="computes in bfloat16, got float16"):
            check_call(registry.get(name), *half, causal=True, group=None, options=opts)


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
    with pytest.raises(ValueError, match="float8_e4m3fn; attention needs a floating dtype of 16"):
        burst_attn(*(t.to(torch.float8_e4m3fn) for t in (q, k, v)))  # torch's NotImplemented
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        burst_attn(q.numpy(), k, v)


def test_the_references_refuse_what_the_methods_refuse():
    """The float64 oracle and the naive baseline took a q batch of 1 against k of 2 (broadcast
    to 2), 3-dim inputs (attended across heads, not tokens), one query head on two kv heads
    (an empty output), and naive_attention a negative scale (a review)."""
    from burst.reference import naive_attention, reference_attention

    q = torch.randn(1, 8, 2, 4, dtype=torch.float64)
    cases = [((q, torch.randn(2, 8, 2, 4).double(), torch.randn(2, 8, 2, 4).double()), {},
              "must agree in batch"),
             ((q[0], q[0], q[0]), {}, "expected 4 dims"),
             ((q[:, :, :1], q, q), {}, "1 query heads are not divisible by 2 kv heads"),
             ((q, q, q), {"scale": -1}, "must be a positive finite number")]
    for args, kw, match in cases:
        for f in (reference_attention, naive_attention):
            with pytest.raises(ValueError, match=match):
                f(*args, **kw)
    assert torch.allclose(naive_attention(q, q, q, causal=True),
                          reference_attention(q, q, q, causal=True)[0])


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


def test_emulation_and_shard_reject_what_burst_attn_rejects():
    """The emulator checks its tensors as burst_attn does (a longer k was silently cut to q's
    length, a smaller batch broadcast); shard refuses world without rank (it took both from the
    process group, i.e. the whole tensor without one)."""
    from burst.emulate import emulate_attn
    from burst.layout import shard

    q, k, v = _qkv(s=16)
    with pytest.raises(ValueError, match="must agree in batch, local sequence length"):
        emulate_attn(q, torch.cat([k, k], 1), torch.cat([v, v], 1), world=2)
    with pytest.raises(ValueError, match="must agree in batch"):
        emulate_attn(torch.cat([q, q]), k, v, world=2)
    with pytest.raises(ValueError, match="dtypes differ"):
        emulate_attn(q, k.double(), v, world=2)
    with pytest.raises(ValueError, match="give world and rank together"):
        shard(q, layout="zigzag", world=4)
    assert shard(q, layout="zigzag", world=4, rank=1).shape[1] == 4
    for world, rank in ((0, 0), (2.0, 0), (True, 0)):  # ZeroDivisionError, index_select error
        with pytest.raises(ValueError, match=f"world={world!r} must be a whole number"):
            shard(q, layout="zigzag", world=world, rank=rank)
    with pytest.raises(ValueError, match=r"rank=1.0 must be a whole number in 0..1"):
        shard(q, layout="zigzag", world=2, rank=1.0)
    for layout in ("contiguous", "zigzag", "striped"):  # past the last rank: another rank's
        for rank in (2, -1):  # tokens reordered (zigzag), or indices past the end (striped)
            with pytest.raises(ValueError, match=rf"rank={rank} must be a whole number in 0..1"):
                shard(q, layout=layout, world=2, rank=rank)
    import numpy as np

    assert shard(q, layout="zigzag", world=np.int64(4), rank=np.int64(1)).shape[1] == 4
    with pytest.raises(ValueError, match="0 query heads and 0 kv heads: need at least one"):
        burst_attn(*_qkv(h=0, hk=0))  # said "valid kv head counts: " (an empty list)
    # these the emulation took: no query head (an empty output), a truthy non-bool return_lse
    # (a tuple returned), a list for q (an AttributeError from autograd)
    with pytest.raises(ValueError, match="expected .* with N > 0 and H % Hk == 0"):
        emulate_attn(*_qkv(s=16, h=0, hk=2), world=2)
    with pytest.raises(ValueError, match="return_lse='no' must be True or False"):
        emulate_attn(q, k, v, world=2, return_lse="no")
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        emulate_attn(q.tolist(), k, v, world=2)


def test_a_group_that_is_no_process_group_is_refused():
    """group="x" ran as one rank without a process group (comm.world_size looked no further)
    and failed inside torch with one; a scale tensor is still taken when it needs no grad."""
    with pytest.raises(TypeError, match="group='x': expected a torch.distributed ProcessGroup"):
        burst_attn(*_qkv(), group="x")
    q, k, v = _qkv()
    torch.testing.assert_close(burst_attn(q, k, v, softmax_scale=torch.tensor(0.3)),
                               burst_attn(q, k, v, softmax_scale=0.3), rtol=0, atol=0)
    from burst import comm

    with pytest.raises(ValueError, match="op='min': all_reduce takes 'sum' or 'max'"):
        comm.all_reduce(torch.zeros(2), op="min")  # ran as max on a group of ranks


def test_no_method_drops_a_second_derivative_silently():
    """A gradient penalty through attention (create_graph=True) on a loss linear in the output
    hands backward a constant gradient, so torch's once_differentiable let the second-order
    term drop without a word (q.grad off by 1.4 against float64). Every hand-written backward
    (ring, all-gather, local attention, emulation, fused loss) refuses it by name; a plain
    backward is unchanged."""
    from baselines import registry
    from burst.emulate import emulate_attn
    from burst.engine.fused_loss import fused_linear_cross_entropy

    q, k, v = (t.double().requires_grad_() for t in _qkv())
    calls = {name: (lambda n=name: registry.get(n)(q, k, v, causal=True))
             for name in ("burst", "ring", "zigzag_ring", "striped_ring", "double_ring",
                          "allgather", "ulysses")}
    calls["emulate"] = lambda: emulate_attn(q, k, v, world=2, causal=True)
    for name, call in calls.items():
        out = call()
        w = torch.randn_like(out)
        with pytest.raises(RuntimeError, match="no second derivative"):
            torch.autograd.grad((out * w).sum(), q, create_graph=True)
        (dq,) = torch.autograd.grad((call() * w).sum(), q)
        assert torch.isfinite(dq).all() and dq.abs().sum() > 0, name
    from burst.engine.trainer import Trainer

    for ck in ("full", "selective"):  # the checkpointed layer's own backward ran with grad off
        tr = Trainer("tiny", dtype=torch.float64, checkpointing=ck, fused_head=False)
        tok, tgt, pos = tr.local_batch(16, batch=1)
        # the final RMSNorm would refuse first (its own message below); without it the
        # checkpointed layer's backward is the first hand-written one the gradient meets
        tr.model.norm = torch.nn.Identity()
        loss = torch.nn.functional.cross_entropy(tr.model(tok, pos).flatten(0, 1),
                                                 tgt.flatten())
        with pytest.raises(RuntimeError, match="^Recompute: no second derivative"):
            torch.autograd.grad(loss, next(tr.model.parameters()), create_graph=True)
    from burst.engine.model import RMSNorm

    norm = RMSNorm(8, 1e-6).double()
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="^RMSNormFn: no second derivative"):
        torch.autograd.grad((norm(x) * torch.randn(3, 8).double()).sum(), x, create_graph=True)
    hidden = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 8, dtype=torch.float64)
    loss = fused_linear_cross_entropy(hidden, weight, torch.randint(0, 11, (6,)))
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(loss, hidden, create_graph=True)


def test_one_ranks_per_node_message_everywhere():
    """The registry's burst entry and the emulation said '4 is not divisible by
    ranks_per_node=2.0; valid: 1, 2, 4' (4 is divisible by 2.0) for a value that is not a ring
    size at all; burst_attn's wording is the one now."""
    from baselines import registry
    from burst.emulate import RingEmulator

    q, k, v = _qkv(s=16)
    for bad in (2.0, 0, True, -1):
        want = f"ranks_per_node must be a whole number >= 1 (or None), got {bad!r}"
        with pytest.raises(ValueError, match=re.escape(want)):
            registry.get("burst").check(world=4, heads=4, kv_heads=4, seq_local=8, causal=True,
                                        ranks_per_node=bad)
        with pytest.raises(ValueError, match=re.escape(want)):
            RingEmulator(q, k, v, world=4, ranks_per_node=bad)
    with pytest.raises(ValueError, match=r"valid values: 1, 2, 4, or any number >= 4"):
        registry.get("burst").check(world=4, heads=4, kv_heads=4, seq_local=8, causal=True,
                                    ranks_per_node=3)


def test_the_default_scale_is_one_over_root_head_dim():
    """The ring and the float64 oracle both took their default from resolve_scale, so a wrong
    default moved both alike and no parity test failed."""
    from burst.emulate import emulate_attn
    from burst.kernel import resolve_scale
    from burst.reference import reference_attention

    assert resolve_scale(64) == 64 ** -0.5 and resolve_scale(64, 0.5) == 0.5
    q, k, v = (t.double() for t in _qkv(s=16, d=16))
    want, _ = reference_attention(q, k, v, causal=True, scale=16 ** -0.5)
    for got in (burst_attn(q, k, v, causal=True), emulate_attn(q, k, v, world=2, causal=True)):
        assert torch.allclose(got, want, atol=1e-12)


def test_an_adapters_unknown_option_lists_only_the_options_it_really_takes():
    """ring_flash_attn's and yunchang's adapters take window, cu_seqlens and backend only to
    refuse them by name (``fn.refuses``): the error for a misspelt option must not offer them
    as valid; and a numpy bool is a bool (a mask flag read from an array or a sweep)."""
    import numpy as np

    from baselines import registry

    q, k, v = _qkv()
    from suites.cells import option_problems
    from suites.spec import MethodSpec

    for name, valid in (("ring_flash_attn", "layout"), ("yunchang", "layout, ulysses_degree")):
        with pytest.raises(ValueError, match=f"has no option 'lyout'; valid options: {valid}$"):
            registry.get(name)(q, k, v, causal=True, lyout="zigzag")
        # a sweep spec is checked by the same rule (it offered window, cu_seqlens and backend)
        assert option_problems(0, MethodSpec(name=name, label="x", options={"lyout": 1})) == [
            f"methods[0] (x).options.lyout: {name!r} has no option 'lyout'; valid options: {valid}"]
    out = registry.get("burst")(q, k, v, causal=np.bool_(True))
    assert torch.equal(out, registry.get("burst")(q, k, v, causal=True))


def test_the_mask_itself_refuses_a_non_bool_causal():
    """burst_attn called directly (not through the registry) and the masks the engine and the
    emulator build: causal='no' ran causal (a non-empty string is true)."""
    from burst.masks import MaskSpec

    with pytest.raises(ValueError, match="causal='no': expected True or False"):
        MaskSpec(causal="no")
    with pytest.raises(ValueError, match="causal=1: expected True or False"):
        burst_attn(*_qkv(), causal=1)


def test_a_torch_below_the_floor_is_refused_at_import():
    """torch < 2.9's CPU flash ops read and write K/V out of bounds with GQA (garbage outputs or
    heap corruption, no error): a checkout used via PYTHONPATH refuses them as pip does.
    Pre-releases and vendor builds of the floor's minor pass."""
    import burst

    for bad in ("2.5.1", "2.8.0+cpu"):
        want = rf"burst needs torch >= 2\.9; this is torch {re.escape(bad)},"
        with pytest.raises(ImportError, match=want):
            burst.check_torch(bad)
    for good in ("2.9.0", "2.9.0a0+50eac81.nv25.09", "2.11.0a0+git1", "2.13.0+cpu"):
        burst.check_torch(good)
    # the same floor as pip's (pyproject.toml)
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert f'"torch>={burst.MIN_TORCH[0]}.{burst.MIN_TORCH[1]}",' in text


def test_a_dimension_or_node_size_out_of_range_is_refused():
    """Found by an API audit: ``unshard(dim=-5)`` of a 4-dim shard wrapped round and gathered
    along head_dim, ``shard(dim=4)`` was an IndexError, and ``count_bytes`` labelled every
    link intra-node for ranks_per_node=0 and inter-node for -1."""
    from burst import comm
    from burst.layout import shard, unshard

    x = torch.randn(1, 8, 2, 4)
    for dim in (-5, 4, 1.0, True):
        with pytest.raises(ValueError, match=f"dim={dim!r} is not a dimension of a 4-dim"):
            unshard(x, layout="zigzag", dim=dim)
        with pytest.raises(ValueError, match="valid: -4 to 3"):
            shard(x, layout="zigzag", dim=dim, world=2, rank=0)
    assert torch.equal(unshard(x, layout="zigzag", dim=-3), x)  # one rank: its shard is all
    for bad in (0, -1, "2", 2.0):
        with (pytest.raises(ValueError, match="ranks_per_node must be a whole number >= 1"),
              comm.count_bytes(ranks_per_node=bad)):
            pass
    # and the byte formulas (a topology audit): ranks_per_node=-1 gave negative bytes, 0 a
    # ZeroDivisionError, 3 of 4 a flat ring; node_size 0 labelled every link intra, -1 inter
    import numpy as np

    from burst.volume import method_bytes, ring_attention_bytes

    shape = dict(world=4, batch=1, seq_local=8, heads=4, kv_heads=4, head_dim=8, elem=2)
    for name in ("ranks_per_node", "node_size"):
        for bad in (0, -1, -2, True, "2", 2.0):
            with pytest.raises(ValueError, match=re.escape(
                    f"{name} must be a whole number >= 1 (or None), got {bad!r}")):
                ring_attention_bytes(**shape, **{name: bad})
        with pytest.raises(ValueError, match=re.escape(
                f"a group of 4 ranks is not divisible by {name}=3; valid values: 1, 2, 4")):
            ring_attention_bytes(**shape, **{name: 3})
    for bad in (0, -1, True, "2", 2.0):
        with pytest.raises(ValueError, match=re.escape(
                f"node_size must be a whole number >= 1 (or None), got {bad!r}")):
            method_bytes("ring", **shape, node_size=bad)
    with pytest.raises(ValueError, match="not divisible by node_size=3"):
        method_bytes("ring", **shape, node_size=3)
    assert method_bytes("ring", **shape, node_size=np.int64(2)).by == method_bytes(
        "ring", **shape, node_size=2).by
    assert ring_attention_bytes(**shape, ranks_per_node=8).by == ring_attention_bytes(**shape).by


def test_loose_arguments_are_refused_by_name():
    """Found by an API audit: a string scale was read as a number, return_lse="no" returned a
    tuple, registry.get(None) and spawn(fn, "2") were TypeErrors from inside, and a Trainer on
    a missing GPU was an AssertionError from torch."""
    import numpy as np

    from baselines import registry
    from burst.engine.trainer import Trainer
    from burst.spawn import spawn

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softmax_scale='0.1' must be a positive finite"):
        burst_attn(q, k, v, softmax_scale="0.1")
    assert burst_attn(q, k, v, softmax_scale=torch.tensor(0.5)).shape == q.shape
    with pytest.raises(ValueError, match="return_lse='no' must be True or False"):
        burst_attn(q, k, v, return_lse="no")
    assert len(burst_attn(q, k, v, return_lse=np.bool_(True))) == 2
    with pytest.raises(ValueError, match="a method name is a string"):
        registry.get(None)
    for world in ("2", 2.0, True, 0):
        with pytest.raises(ValueError, match=f"world={world!r}: need a whole number of ranks"):
            spawn(print, world)
    # Method.check alone (the sweep planner's and the simulator's gate) names what a call
    # would refuse later
    with pytest.raises(ValueError, match="6 query heads are not divisible by 4 kv heads"):
        registry.get("ring").check(world=4, seq_local=8, causal=True, heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="unknown grad_acc 'bf16'"):
        registry.get("zigzag_ring").check(world=4, seq_local=8, causal=True, heads=4,
                                          kv_heads=4, grad_acc="bf16")
    for threads in (0, 1.5, "2", True):
        with pytest.raises(ValueError, match=f"threads={threads!r}: need a whole number"):
            spawn(print, 2, threads=threads)
    for timeout_s in (0, -1, float("nan"), float("inf"), "60", None):
        with pytest.raises(ValueError, match="timeout_s=.*: need a finite number of seconds"):
            spawn(print, 2, timeout_s=timeout_s)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device"):
            Trainer("tiny", device="cuda")


@pytest.mark.parametrize("fixed", [False, True])
def test_an_old_ring_flash_attn_is_refused_on_a_sub_group(tmp_path, monkeypatch, fixed):
    """Early ring-flash-attn releases send to group-local rank numbers as if global: on the
    Trainer's CP sub-group (DP > 1) an NCCL hang or wrong data. Refused by name; a release
    that maps them (dist.get_global_rank) runs, as does the whole world."""
    from baselines import external

    pkg = tmp_path / "ring_flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    mapping = "dist.get_global_rank(group, peer)" if fixed else "peer"
    (pkg / "utils.py").write_text(f"class RingComm:\n    def peer(self):\n"
                                  f"        return {mapping}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("ring_flash_attn", "ring_flash_attn.utils"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    sizes = {"cp": 2, None: 4}
    monkeypatch.setattr(external.comm, "world_size", lambda group=None: sizes[group])
    assert external._rfa_peers_problem(None) is None
    problem = external._rfa_peers_problem("cp")
    if fixed:
        assert problem is None
    else:
        assert "sub-group of 2 of 4 ranks" in problem
        assert "pip install -U ring-flash-attn" in problem


def test_remakeable_takes_a_tuple_and_recording_restores_its_recorder():
    """remakeable took ``tuple(fn(...))``: a recipe that returned one tensor came back as the
    tuple of its rows (``remakeable(f, t)[0]`` was row 0 of the batch, no error). And the
    recorder of a ``recording`` block must not outlive it (an exception included), or every
    later remakeable call would report to a dead cache entry and keep its tensors alive."""
    from burst.remake import recording, remakeable

    t = torch.arange(6.0).reshape(3, 2)
    with pytest.raises(TypeError, match="returned a Tensor, not a tuple"):
        remakeable(lambda x: x * 2, t)
    (doubled,) = remakeable(lambda x: (x * 2,), t)
    assert torch.equal(doubled, t * 2)
    outer, inner = [], []
    with recording(lambda *a: outer.append(a)):
        remakeable(lambda x: (x,), t)
        with pytest.raises(KeyError), recording(lambda *a: inner.append(a)):
            remakeable(lambda x: (x,), t)
            raise KeyError("inside")
        remakeable(lambda x: (x,), t)  # the outer recorder again
    remakeable(lambda x: (x,), t)  # outside: a plain call, told to no one
    assert (len(outer), len(inner)) == (2, 1)
    fn, inputs, outputs = outer[0]
    assert inputs == (t,) and outputs[0] is t


def test_every_hand_written_backward_refuses_a_second_derivative():
    """Each torch.autograd.Function here decorates its backward with ``first_order`` (the TP
    block's raw-collective backwards did not: a gradient penalty through it lost a term,
    silently), save an identity whose backward is itself differentiable."""
    import ast

    root = Path(__file__).resolve().parents[1]
    identities = {"_Anchor"}  # burst/engine/checkpointing.py: returns g as it came
    found, bare = [], []
    for path in sorted([*root.glob("burst/**/*.py"), *root.glob("baselines/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ClassDef)
                    and any(ast.unparse(b).endswith("autograd.Function") for b in node.bases)):
                continue
            found.append(node.name)
            for fn in node.body:
                if (isinstance(fn, ast.FunctionDef) and fn.name == "backward"
                        and "first_order" not in [ast.unparse(d) for d in fn.decorator_list]
                        and node.name not in identities):
                    bare.append(f"{path.relative_to(root)}:{node.name}")
    assert len(found) >= 12 and set(identities) <= set(found), found
    assert bare == [], bare


def test_a_bad_input_audit_of_the_public_helpers(tmp_path, monkeypatch):
    """Found by a bad-input audit: attention_flops counted causal="no" as causal, -1024 tokens
    as 1023 x 1024 / 2 pairs and a negative window as negative FLOPs; ModelConfig took a NaN
    eps and an infinite RoPE base; Trainer(dtype="bfloat16") said "dtype: None"; a misspelt
    link counted 0 bytes; a spec's cell problem named the entry after an unreadable one by
    the wrong index; a results folder named like a shipped spec in the current directory
    shadowed it; bytes_table ignored its arguments."""
    import dataclasses

    from burst import comm, flops
    from burst.engine.configs import get_config
    from burst.engine.trainer import Trainer
    from suites.spec import SPEC_DIR, SpecError, parse_spec, spec_path

    for kw, match in ((dict(causal="no"), "causal='no'"), (dict(causal=True, window=(-5, 0)),
                      r"window=\(-5, 0\)"), (dict(causal=True, cu_seqlens=(0, 9, 5, 16)),
                                             "non-decreasing")):
        with pytest.raises(ValueError, match=match):
            flops.attention_flops(1, 16, 2, 8, **kw)
    for args in ((1, -16, 2, 8), (1, 16, -2, 8), (1, 16.0, 2, 8)):
        with pytest.raises(ValueError, match="whole number"):
            flops.attention_flops(*args, causal=True)
    import numpy as np

    assert flops.attention_flops(np.int64(1), np.int64(16), 2, 8, causal=True) == \
        flops.attention_flops(1, 16, 2, 8, causal=True)
    for k, v in (("rms_eps", float("nan")), ("rope_theta", float("inf"))):
        with pytest.raises(ValueError, match=f"{k}={v!r} must be a positive number"):
            dataclasses.replace(get_config("tiny"), **{k: v})
    assert Trainer("tiny", dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"not float16 \(float16 would need loss scaling\)"):
        Trainer("tiny", dtype="float16")
    with pytest.raises(ValueError, match=r"float64, bfloat16, not bf16$"):  # (no float16 hint)
        Trainer("tiny", dtype="bf16")
    with comm.count_bytes() as c:
        pass
    with pytest.raises(ValueError, match="link='internode'; valid: 'intra', 'inter'"):
        c.sent("backward", "internode")
    data = {"workload": "attention", "world": 2, "seq_lens": [256],
            "shape": {"heads": 2, "head_dim": 16},
            "methods": [{"name": "ring", "options": 5}, {"name": "ring"},
                        {"name": "usp", "options": {"ulysses_degree": 4}}]}
    with pytest.raises(SpecError) as e:
        parse_spec(data, name="x")
    assert any(p.startswith("methods[2] (usp") for p in e.value.problems), e.value.problems
    for bad in (2.0, True):  # a degree of the wrong type says so (it read as a bad divisor)
        data["methods"] = [{"name": "usp", "options": {"ulysses_degree": bad}}]
        with pytest.raises(SpecError) as e:
            parse_spec(data, name="x")
        assert f"ulysses_degree={bad!r} must be a whole number (an int)" in str(e.value), e.value
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").mkdir()  # a run's folder (burst-bench run smoke --out .)
    assert spec_path("smoke") == SPEC_DIR / "smoke.toml"
    with pytest.raises(ValueError, match="is a folder"):
        spec_path("./smoke")
    from baselines import bytes_table

    with pytest.raises(SystemExit) as e:
        bytes_table.main(["--world", "16"])
    assert e.value.code == 2
