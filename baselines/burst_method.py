"""BurstAttention itself as a registry entry, so it is benchmarked exactly like the baselines."""

from __future__ import annotations

from baselines.checks import layout_problems
from baselines.registry import Method, register
from burst import burst_attn
from burst.attention import choice_problems
from burst.comm import ranks_per_node_problem
from burst.layout import LAYOUTS

__all__ = ["burst_method"]


def _burst(q, k, v, *, causal, softmax_scale, group, layout="zigzag", backward="auto",
           ranks_per_node=None, window=None, cu_seqlens=None, backend="auto", grad_acc="fp32"):
    return burst_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, layout=layout,
                      group=group, ranks_per_node=ranks_per_node, backward=backward,
                      window=window, cu_seqlens=cu_seqlens, backend=backend, grad_acc=grad_acc)


def _requires(*, world, seq_local, layout="zigzag", ranks_per_node=None, backward="auto",
              grad_acc="fp32", **_):
    out = layout_problems(layout, seq_local) + choice_problems(backward=backward,
                                                                 grad_acc=grad_acc)
    why = ranks_per_node_problem(world, ranks_per_node)
    return out + [why] if why else out


burst_method = register(Method(
    name="burst",
    fn=_burst,
    description="BurstAttention: K/V ring forward, Q/dO/D/LSE + trailing dQ backward "
                "(optionally topology-aware double ring)",
    layouts=LAYOUTS,
    options={"layout": "zigzag", "backward": "burst"},
    requires=_requires,
))
