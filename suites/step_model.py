"""Time of one engine training step (forward + backward + optimizer) per rank, for the simulator.

Per decoder layer (FLOPs from ``burst.flops``; attention from ``suites.schedule``):
  forward    dense GEMMs + memory-bound elementwise work + the attention layer's forward
  backward   2 x dense + 2 x elementwise + the attention backward + what the checkpointing mode
             recomputes (``burst.flops.recompute_flops`` names the same modes):
               none            nothing
               full            the whole layer, ring attention included
               selective       the layer without attention (its out and lse are cached)
               selective_half  as selective + the attention of the first half of the sequence
  ZeRO-3     all-gather the layer's bf16 parameters before forward and again before backward,
             reduce-scatter its gradients after; prefetched, so a layer takes
             max(compute, collectives). Weights whole on every rank (Megatron's distributed
             optimizer): one gradient reduce-scatter and one weight all-gather per step instead;
             nothing sharded (this project's engine): all-reduces of the gradients in the
             model's dtype after the backward (in buckets, the bytes of one), and the optimizer
             on every parameter
The LM head (plain or fused: the same FLOPs and logits traffic, in chunks for the fused one,
whose gain is memory at long local sequences, ``suites.memory_model``), the loss and the
optimizer (memory-bound Adam on the 1/G shard, or on the CPU with offload) are added once.

Elementwise bytes per token per layer are counted on burst.engine.model's layer: two RMSNorms
(read + write), rotary on q and k, two residual adds, SwiGLU (read gate and up, write product).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from burst import flops as F
from burst.engine.configs import vocab_params
from suites.hardware import Hardware
from suites.memory_model import engine_bytes_per_param, master_bytes, zero_bytes_per_param
from suites.schedule import AttnShape, AttnTiming, Topo, acc_bytes, collective_seconds

__all__ = ["StepTiming", "train_step_timing"]

BF16 = 2


@dataclass
class StepTiming:
    total_s: float
    parts: dict[str, float] = field(default_factory=dict)


def _elementwise_bytes(cfg, tokens: int, elem: int = BF16) -> float:
    h, d = cfg.hidden_size, cfg.hidden_size // cfg.num_heads
    kvd = cfg.num_kv_heads * d
    mlp = 3 if F.gated_mlp(cfg) else 2  # elementwise tensors: silu(gate) * up; gelu(up)
    per_token = 2 * 2 * h + 2 * (h + kvd) + 2 * 3 * h + mlp * cfg.ffn_size
    return tokens * per_token * elem


def train_step_timing(hw: Hardware, cfg, *, shape: AttnShape, topo: Topo, attn: AttnTiming,
                      checkpointing: str, params: int,
                      half_attn: AttnTiming | None = None,
                      offload: bool = False, sharded_params: bool = True,
                      sharded_states: bool = True, world_sharded: bool = False,
                      regather_s: float = 0.0) -> StepTiming:
    """Seconds of one training step on the slowest rank.

    ``attn`` times one attention layer of this shape; ``half_attn`` (selective_half only) the
    forward of the same method on the first half of the sequence; ``regather_s`` the all-to-alls
    a layer's recomputation runs again (this project's selective Ulysses / USP).
    ``sharded_params`` False: the weights stay whole on every rank (Megatron's distributed
    optimizer): no per-layer all-gathers, but one reduce-scatter of the fp32 main gradients and
    one all-gather of the updated weights per step, after the backward (not overlapped).
    ``sharded_states`` False: nothing is sharded (this project's engine): the gradients'
    all-reduces in the model's dtype after the backward (not overlapped), and the optimizer
    steps every parameter; with ``world_sharded`` (its ``data_parallel="fsdp_world"``) the decoder
    layers are gathered and their gradients reduce-scattered as ZeRO-3's (in fp32 for a 16-bit
    model: its master weights), the root unit (embedding, head) is gathered once before the
    forward and its gradients reduce-scattered after the backward (not overlapped), and the
    optimizer steps this rank's 1/G of the parameters.
    """
    g, b, seq = topo.world, shape.batch, shape.seq_len
    layers = cfg.num_layers
    tokens = b * seq // g
    # forward FLOPs per rank, split with burst.flops' own conventions
    dense_layers = F.layer_flops(cfg, b, seq) / g
    head = F.head_flops(cfg, b, seq) / g
    e, dtype = shape.elem, shape.dtype  # the model's dtype: weights, activations, GEMMs
    dense = hw.gemm_seconds(dense_layers / layers, dtype)
    elem = hw.hbm_seconds(_elementwise_bytes(cfg, tokens, e))
    a_fwd, a_bwd = attn.forward_s, attn.backward_s
    if checkpointing == "selective_half" and half_attn is None:
        raise ValueError("selective_half: give half_attn, the attention timing of the first "
                         "N/2 tokens (its forward runs again in backward)")
    a_again = {"none": 0.0, "full": a_fwd, "selective": 0.0,  # attention forward run again
               "selective_half": half_attn.forward_s if half_attn else 0.0}[checkpointing]
    recompute = 0.0 if checkpointing == "none" else dense + elem + a_again + regather_s
    layer_params = (params - vocab_params(cfg)) / layers
    gather = collective_seconds(hw, layer_params * e * (g - 1) / g, g, topo, "gather")
    scatter = gather  # a layer's gradient reduce-scatter: the same bytes as its gather
    per_step = 0.0
    if not sharded_params:  # fp32 main gradients reduce-scattered, the new weights gathered
        per_step = (collective_seconds(hw, params * acc_bytes(e) * (g - 1) / g, g, topo, "gather")
                    + collective_seconds(hw, params * e * (g - 1) / g, g, topo, "gather"))
        gather = scatter = 0.0
    if not sharded_states and world_sharded:  # ZeRO-3's, and the root unit's gather and
        # reduce-scatter; FSDP reduces a 16-bit model's gradients in fp32 (master weights)
        m = master_bytes(e)
        scatter = collective_seconds(hw, layer_params * m * (g - 1) / g, g, topo, "gather")
        per_step = sum(collective_seconds(hw, vocab_params(cfg) * x * (g - 1) / g, g, topo,
                                          "gather") for x in (e, m))
    elif not sharded_states:  # an all-reduce = a reduce-scatter + an all-gather of the same
        per_step = 2 * collective_seconds(hw, params * e * (g - 1) / g, g, topo, "gather")
        gather = scatter = 0.0
    fwd = max(dense + elem + a_fwd, gather)
    bwd = max(2 * dense + 2 * elem + a_bwd + recompute, gather + scatter)
    # head + loss: 3 passes of the head GEMM, the loss reads/writes the logits a few times
    logits_bytes = tokens * cfg.vocab_size * (e + 2 * acc_bytes(e))
    head_s = hw.gemm_seconds(3 * head, dtype) + hw.hbm_seconds(2 * logits_bytes)
    shard = params / g
    if not sharded_states:  # read and write every param, grad, m, v (no master copy)
        opt = hw.hbm_seconds((shard if world_sharded else params)
                             * engine_bytes_per_param(e, world_sharded) * 2)
    elif offload:
        opt = hw.offload_seconds(shard, e)
    else:  # read and write params, grads, (master,) m, v
        opt = hw.hbm_seconds(shard * zero_bytes_per_param(e) * 2)
    parts = {"layers_forward": layers * fwd, "layers_backward": layers * bwd,
             "head": head_s, "optimizer": opt,
             "attention": layers * (a_fwd + a_bwd + a_again),
             # the model states' collectives: ZeRO-3's per-layer gathers and reduce-scatters,
             # the distributed optimizer's, or this engine's all-reduces (fsdp_world: ZeRO-3's
             # and its root unit's all-gather and reduce-scatter)
             "state_collectives": layers * (2 * gather + scatter) + per_step,
             # those that overlap no compute, once a step: the distributed optimizer's and this
             # engine's after the backward (fsdp_world: its root unit's gather before the forward
             # and reduce-scatter after the backward)
             "per_step_collectives": per_step}
    return StepTiming(total_s=parts["layers_forward"] + parts["layers_backward"] + head_s + opt
                      + per_step, parts=parts)
