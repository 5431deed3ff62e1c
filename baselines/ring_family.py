"""Classic ring attention and its causal load-balanced variants, as thin adapters over the core.

All three are ``burst_attn(..., backward="ring")``: K/V travel the ring in the forward pass
(merged by log-sum-exp, fp32 running O and LSE) and the backward circulates K, V again together
with the accumulating fp32 dK, dV, which trail one hop behind and return to their owner
(DESIGN.md 3, "The classic ring backward"). That is the schedule of ring-flash-attention
(zhuzilin): K/V G-1 hops forward; K/V G-1 hops plus fp32 dK/dV G hops backward. Option
``grad_acc="input"`` sends dK/dV in the input dtype instead, as TransformerEngine's p2p context
parallelism (Megatron-CP) does: its backward circulates one buffer of (K/V, dK/dV) allocated in
kv's dtype (TransformerEngine ``context_parallel.py``, ``AttnFuncWithCPAndKVP2P.backward``).

- ``ring``         contiguous layout (ring-flash-attention's ``ring_flash_attn_func``).
- ``zigzag_ring``  zigzag layout, causal only (``zigzag_ring_flash_attn_func``; Megatron and
                   TransformerEngine's p2p context parallelism use the same split; with
                   ``grad_acc="input"`` it moves TransformerEngine's bytes).
- ``striped_ring`` striped layout, causal only (Striped Attention; ``stripe_flash_attn_func``).

Where ours differs from the packages (neither changes a byte for plain causal/full masks): fully
masked block pairs are skipped by ``burst.masks`` instead of being branched on per step, and a
sliding window truncates the ring (``window``/``cu_seqlens`` are passed through).
"""

from __future__ import annotations

from baselines.checks import check_call, layout_problems
from baselines.registry import Method, register
from burst import burst_attn
from burst.attention import choice_problems

__all__ = ["ring_attn", "striped_ring_attn", "zigzag_ring_attn"]


def _requires(*, seq_local, layout, grad_acc="fp32", **_):
    return layout_problems(layout, seq_local) + choice_problems(grad_acc=grad_acc)


def _adapter(name: str, layout: str):
    def fn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, group=None,
           layout: str = layout, window: tuple[int, int] | None = None, cu_seqlens=None,
           backend: str = "auto", grad_acc: str = "fp32"):
        check_call(_METHODS[name], q, k, v, causal=causal, group=group,
                   options=dict(layout=layout, grad_acc=grad_acc), backend=backend)
        return burst_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, layout=layout,
                          group=group, backward="ring", window=window, cu_seqlens=cu_seqlens,
                          backend=backend, grad_acc=grad_acc)

    fn.__name__ = f"{name}_attn"
    fn.__doc__ = (f"Classic ring attention on the {layout} layout (K/V forward; K, V, dK, dV "
                  "backward). q (batch, seq_local, heads, head_dim); k, v (batch, seq_local, "
                  "kv_heads, head_dim); returns out shaped like q.")
    return fn


ring_attn = _adapter("ring", "contiguous")
zigzag_ring_attn = _adapter("zigzag_ring", "zigzag")
striped_ring_attn = _adapter("striped_ring", "striped")

_METHODS: dict[str, Method] = {}
for _name, _fn, _layout, _desc in (
    ("ring", ring_attn, "contiguous",
     "classic ring attention: contiguous layout, K/V forward, K/V + trailing dK/dV backward"),
    ("zigzag_ring", zigzag_ring_attn, "zigzag",
     "ring attention with zigzag causal load balance (ring-flash-attn zigzag, TE p2p CP)"),
    ("striped_ring", striped_ring_attn, "striped",
     "ring attention with striped causal load balance (Striped Attention)"),
):
    _METHODS[_name] = register(Method(
        name=_name, fn=_fn, description=_desc, layouts=(_layout,),
        causal_only=_layout != "contiguous", options={"layout": _layout}, requires=_requires,
    ))
