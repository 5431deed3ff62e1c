"""Peak memory per rank of an attention layer or an engine training step, for the simulator.

Counted, not fitted: every term is a tensor the code (or the system it stands for) holds, in
bytes, named after what it is. The only calibrated constant is the hardware profile's allocator
overhead (reserved / allocated). A cell is predicted OOM when the reserved peak exceeds the
profile's usable memory.

Training step (the paper's systems: ZeRO-3 over all G ranks unless their profile says
otherwise; this project's engine: nothing sharded, ``Implementation.sharded_states``):
  model states   params bf16 + grads bf16 + fp32 master, m, v = 16 bytes / parameter / G
                 (ZeRO, Rajbhandari et al. 2020: 2 + 2 + K, K = 12); with offload only the bf16
                 parameter and gradient shards stay on the GPU; a system with
                 ``replicated_bytes_per_param`` r (Megatron's distributed optimizer) holds
                 r bytes / parameter whole (a 16-bit model's: 6; 8 in float32, weights and
                 main gradients both fp32) and shards only the fp32 optimizer (12 / G); this
                 project's engine holds weights, gradients and AdamW's two moments whole, in
                 the model's dtype: 4 x 2 = 8 bytes / parameter in bf16
  gathered       the current and the prefetched layer's full bf16 parameters + one layer's bf16
                 gradients before their reduce-scatter (ZeRO-3 only)
  checkpoints    per layer: the layer input (full, selective, selective_half); plus the cached
                 attention output and lse (selective; half of them for selective_half; this
                 project's Ulysses / USP keep their kernel's head-sharded output, the same
                 bytes); no checkpointing keeps every activation of every layer
  layer peak     backward of one layer: its activations again (recomputed, unless nothing is
                 checkpointed: then they are among the checkpoints; selective replays its
                 cached attention output and lse, the same storage) + the gradients of
                 the MLP's gate and up projections (the largest live at once; the others reuse
                 freed activations) + the attention method's buffers (the ring's blocks and
                 fp32 accumulators in flight, Ulysses' gathered heads)
  head           plain: the whole local logits at the loss, N/G x V x ``logits_bytes`` (fp32
                 logits and their fp32 gradient: 8; this project's engine 12, ``OURS``;
                 doubled for a float64 model, whose accumulators are float64);
                 fused: one chunk of bf16 logits, their fp32 copy and gradient + the fp32
                 weight gradient (burst.engine.fused_loss);
                 + the head's gathered weight and gradient (ZeRO-3), its gradient (this
                 project's engine) or nothing (weights and gradients whole in the states)
  implementation what a system's training framework holds for the whole sequence
                 (``global_token_bytes`` per token); an attention layer alone has none
The peak is the larger of the head moment (all checkpoints + head) and the last layer's
backward. This project's engine has a third moment, and holds its states by moment
(``_engine_moments``): weights and AdamW moments in the forward, gradients growing in the
backward as the checkpoints are freed (so its first layer's backward, with every other
layer's gradient, can hold more than its last one's), and at the optimizer step all four
plus foreach AdamW's sqrt(v), 5 x e per parameter
(with ``data_parallel="fsdp_world"``: 1/G of them at rest, in fp32 for a 16-bit model, so 16
bytes / parameter / G as ZeRO's; the embedding and head gathered for the step and the decoder
layers one at a time, as ZeRO-3).
"bf16" above is the model's dtype (``AttnShape.dtype``): float32 and float64 models hold their
weights, gradients and activations in it and keep no master copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from burst import volume
from burst.engine.configs import vocab_params
from burst.engine.fused_loss import LOSS_CHUNK
from burst.flops import gated_mlp
from burst.masks import MaskSpec
from suites.hardware import GIB, Hardware
from suites.implementations import Implementation
from suites.schedule import AttnShape, Plan, acc_bytes, ring_reach_of

__all__ = ["MemoryEstimate", "attention_memory", "checkpoint_bytes", "engine_bytes_per_param",
           "head_bytes", "head_weight_copies", "layer_activation_bytes", "master_bytes",
           "train_memory", "zero_bytes_per_param"]

BF16, FP32 = 2, 4


def zero_bytes_per_param(elem: int = BF16) -> int:
    """Model states per parameter under Adam: weight and gradient in the model's dtype, two
    moments in at least fp32, and an fp32 master copy of 16-bit weights (ZeRO, arXiv 1910.02054,
    3.1: 2 + 2 + 12 = 16 for mixed precision)."""
    return 2 * elem + 2 * acc_bytes(elem) + (FP32 if elem < FP32 else 0)


def engine_bytes_per_param(elem: int = BF16, sharded: bool = False) -> int:
    """Model states per parameter of this project's engine: weight, gradient and torch AdamW's
    two moments (``exp_avg``, ``exp_avg_sq``, allocated like the parameter), all in the model's
    dtype, whole on every rank (``Implementation.sharded_states``); ``sharded`` (FSDP shards
    them, ``data_parallel="fsdp_world"``): all four in fp32 for a 16-bit model (its master
    weights, ``Trainer.master_weights``), 16 bytes like ZeRO's, before dividing by G."""
    return 4 * (master_bytes(elem) if sharded else elem)


def master_bytes(elem: int) -> int:
    """Bytes per element of the weights FSDP keeps for a model of ``elem``-byte elements:
    fp32 for a 16-bit model (mixed precision), else the model's own."""
    return max(elem, FP32)


@dataclass
class MemoryEstimate:
    """Bytes per rank by component; ``reserved`` includes the allocator overhead."""

    parts: dict[str, float] = field(default_factory=dict)
    allocated: float = 0.0
    reserved: float = 0.0
    usable: float = 0.0

    @property
    def fits(self) -> bool:
        return self.reserved <= self.usable

    @property
    def reserved_gib(self) -> float:
        return self.reserved / GIB


def _finish(parts: dict[str, float], hw: Hardware) -> MemoryEstimate:
    allocated = sum(parts.values())
    return MemoryEstimate(parts=parts, allocated=allocated,
                          reserved=allocated * (1 + hw.allocator_overhead),
                          usable=hw.usable_bytes)


def _float64_scores(shape: AttnShape, plan: Plan, world: int) -> float:
    """float64 attention runs this project's ``torch`` kernel backend (burst.kernel: no fused
    kernel takes float64), which materialises a call's scores: s, p, dp and ds of the largest
    call are live at once in backward. An upper bound: a call plan may split the block."""
    if shape.elem != 8:
        return 0.0
    b, n, big, h = shape.batch, shape.seq_len // world, shape.seq_len, shape.heads
    if plan.kind == "ring":  # local queries against one local key block
        q, k, heads = n, n, h
    elif plan.kind == "usp":  # the ring over U x n tokens, H / U heads
        q = k = plan.ulysses * n
        heads = -(-h // plan.ulysses)
    elif plan.kind == "allgather":  # local queries against the gathered keys
        q, k, heads = n, big, h
    else:  # ulysses / tp: the whole sequence for H / G heads
        q = k = big
        heads = -(-h // (plan.ulysses or world))
    return 4 * b * heads * q * k * 8


def _attention_buffers(shape: AttnShape, plan: Plan, world: int,
                       members: int | None = None, estimated: bool = False) -> float:
    """Communication buffers and fp32 accumulators of one attention backward (its peak).

    ``members``: ranks of the ring (default ``world``). A group of one sends nothing: a ring of
    one keeps only its accumulators (``burst.ring`` allocates receive buffers for the steps
    before the last), and a collective over one rank returns its input (``burst.comm``).
    ``estimated``: ``Implementation.estimated_ring_buffers`` (a paper system's ring)."""
    b, n, d, e = shape.batch, shape.seq_len // world, shape.head_dim, shape.elem
    h, hk = shape.heads, shape.kv_heads
    acc = acc_bytes(e)
    members = world if members is None else members
    if plan.kind == "ring":
        # one hop's payload and travelling accumulators (fp32, or the input dtype with
        # grad_acc="input"): Q, dO, D, LSE + dQ (burst: dK, dV accumulate locally, in fp32) or
        # K, V + dK, dV (ring: dQ accumulates locally)
        travel = e if (plan.options or {}).get("grad_acc") == "input" else None
        data, grads = volume.ring_hop_bytes(plan.backward, batch=b, seq_local=n, heads=h,
                                            kv_heads=hk, head_dim=d, elem=e, acc_elem=acc,
                                            grad_elem=travel)
        local = (2 * b * n * hk * d if plan.backward == "burst" else b * n * h * d) * acc
        if members == 1:
            return grads + local
        if estimated:  # a paper system: one block and its accumulators in flight each way
            bufs = 3 if plan.ring_local else 2  # (a double ring: one more across nodes)
            return bufs * (data + grads) + local
        # what burst.ring holds at once besides the rank's own block (counted in a gloo
        # backward, every allocation of its _empty/_zeros tracked): a ring of L > 2 ranks the
        # block it works on and the one arriving (one with L = 2), and three accumulators
        # (being filled, in flight out, in flight in; one in a ring of one). A double ring of M
        # nodes also holds the outer block arriving from the next node and, from the second
        # node's block on, the one it works on (with M > 2 both at once), and the node's
        # accumulator in flight across nodes and the one arriving. A flat ring shortened by a
        # window, or sending its blocks both ways, is replayed (_flat_ring_peak).
        double = plan.ring_local and plan.ring_local < members
        if not double:
            reach = ring_reach_of(shape, plan.layout, members, shape.seq_len // members)
            return _flat_ring_peak(*reach, data, grads) + local
        blocks = min(2, plan.ring_local - 1) + (2 if members // plan.ring_local > 2 else 1)
        accs = (3 if plan.ring_local > 1 else 1) + 2
        return blocks * data + accs * grads + local
    if plan.kind == "usp":
        # heads gathered by the all-to-all (same bytes as the local q, k, v, o; kv heads fewer
        # than the degree are replicated up to it) + the ring's buffers on U*n tokens x H/U
        # heads (the same bytes as n tokens x H heads), a ring of G/U ranks
        hk = volume.ulysses_kv_heads(hk, plan.ulysses)
        gathered = b * n * (2 * h + 2 * hk) * d * e if plan.ulysses > 1 else 0
        sub = Plan("ring", layout=plan.layout, backward=plan.backward,
                   options={"grad_acc": (plan.options or {}).get("grad_acc", "fp32")})
        return gathered + _attention_buffers(dataclasses.replace(shape, kv_heads=hk), sub, world,
                                             members=world // plan.ulysses, estimated=estimated)
    # ulysses / tp / allgather: the gathered inputs and their gradients
    if plan.kind == "allgather":
        # baselines/allgather.py's backward: K, V gathered over the whole sequence (a group of
        # one keeps its own), their gradients accumulated there in fp32 (dk_all, dv_all), the
        # local dq in fp32, and, at the reduce-scatter of dk_all, its copy in the input dtype
        # when that is not the accumulators' (comm.reduce_scatter hands a group of one that
        # copy back as its gradient), with its pieces copied when the batch makes them strided.
        # An input already in the accumulators' dtype (fp32) gets dq, and in a group of one dK
        # and dV, back as its gradients: counted here too, as the ring's accumulators are (on
        # the safe side, one local dq at most, or three in a group of one). Counted in the
        # input dtype before, without dq and the copy: 32 GiB of 58 for 4M tokens on 32 A800s
        # (32 heads, 8 KV heads of 128), 39.8 GiB reserved against 67.8 now, and 6M tokens
        # priced to fit at 59.7 (a metamorphic audit)
        whole = shape.seq_len * b * hk * d
        grads = 2 * whole * acc + b * n * h * d * acc
        if world == 1:
            return grads
        cast = whole * e if e != acc else 0
        pieces = whole * e if b > 1 else 0
        return 2 * whole * e + grads + cast + pieces
    degree = plan.ulysses or world
    if plan.kind == "ulysses":  # kv heads fewer than the degree are replicated up to it
        hk = volume.ulysses_kv_heads(hk, degree)
    gathered = 2 * b * n * (2 * h + 2 * hk) * d * e if degree > 1 else 0
    if MaskSpec(causal=shape.causal, window=shape.window).over(shape.seq_len).is_plain:
        return gathered
    # a window shorter than the sequence tiles the whole-sequence attention (burst.masks.plan_pair):
    # its calls merge into fp32 dq, dk, dv (baselines/local_attention.py), the same elements as
    # the local q, k, v
    return gathered + b * n * (h + 2 * hk) * d * acc


def _flat_ring_peak(span: int, back: int, data: float, grads: float) -> float:
    """Most bytes of blocks (``data`` each) and travelling accumulators (``grads`` each) that
    ``burst.ring._flat`` holds at once, besides the rank's own block, replayed step by step
    (its chains, ``burst.ring._Chain``: ``span`` hops one way, ``back`` the other).

    A chain holds the block it works on from its first received one on, and from each step
    before its last the one arriving. Its accumulators: at a working step a fresh one, while
    the previous one is still in flight and the next partial sum's receive buffer waits (three;
    two at its first step, and from then on two). The first chain works at steps 0..span (its
    own block's accumulator stays home when span is 0: one), the other at 1..back, after the
    first chain in each step. A one-way ring of two steps or more: two blocks, three
    accumulators."""
    def blocks(t: int) -> int:
        return sum((reach >= 1 and t >= 1) + (t < reach) for reach in (span, back))

    first_after = 1 if span == 0 else 2  # the first chain's accumulators once it has worked
    peak = 0.0
    for t in range(max(span, back) + 1):
        other = 2 if back and t >= 2 else 0  # the second chain's, from its second step on
        if t <= span:  # the first chain's fresh accumulator
            accs = (2 + 1 + other) if t else first_after
            peak = max(peak, blocks(t) * data + accs * grads)
        if 1 <= t <= back:  # the second chain's, the first chain's held
            accs = first_after + (3 if t >= 2 else 2)
            peak = max(peak, blocks(t) * data + accs * grads)
    return peak


def attention_memory(hw: Hardware, shape: AttnShape, plan: Plan, world: int, *,
                     estimated_ring_buffers: bool = False) -> MemoryEstimate:
    """One attention layer forward + backward: inputs, outputs, grads, lse, buffers
    (``estimated_ring_buffers``: ``Implementation.estimated_ring_buffers``)."""
    b, n, d, e = shape.batch, shape.seq_len // world, shape.head_dim, shape.elem
    h, hk = shape.heads, shape.kv_heads
    parts = {
        "inputs_outputs": b * n * (2 * h + 2 * hk) * d * e,  # q, k, v, out
        "grads": b * n * (2 * h + 2 * hk) * d * e,  # dout, dq, dk, dv
        "lse_delta": 2 * b * h * n * acc_bytes(e),
        "comm_buffers": _attention_buffers(shape, plan, world,
                                           estimated=estimated_ring_buffers),
    }
    if shape.elem == 8:
        parts["float64_scores"] = _float64_scores(shape, plan, world)
    return _finish(parts, hw)


def layer_activation_bytes(cfg, tokens: int, elem: int = BF16) -> dict[str, float]:
    """Bytes one decoder layer saves for backward without checkpointing, by tensor.

    Counted on burst.engine.model's layer, equal to what it keeps (a test measures it): two
    RMSNorms (input and output kept, and each row's 1/rms in fp32, float64 in float64 runs),
    q/k/v after rotary, attention out + fp32 lse, the SwiGLU gate, up, activation and product
    (the GELU MLP's up and activation)."""
    h, d = cfg.hidden_size, cfg.hidden_size // cfg.num_heads
    kvd = cfg.num_kv_heads * d
    return {
        "norms": tokens * 4 * h * elem,
        "norm_stats": tokens * 2 * acc_bytes(elem),
        "qkv": tokens * (h + 2 * kvd) * elem,
        "attention_out": tokens * h * elem,
        "lse": tokens * cfg.num_heads * acc_bytes(elem),
        # SwiGLU: gate, up, silu(gate), the product; GELU MLP: up and gelu(up)
        "mlp": tokens * (4 if gated_mlp(cfg) else 2) * cfg.ffn_size * elem,
    }


def checkpoint_bytes(cfg, tokens: int, mode: str, elem: int = BF16) -> float:
    """Bytes kept per layer between forward and backward, by checkpointing mode."""
    act = layer_activation_bytes(cfg, tokens, elem)
    layer_input = tokens * cfg.hidden_size * elem
    cached = act["attention_out"] + act["lse"]
    return {"none": sum(act.values()), "full": layer_input,
            "selective": layer_input + cached,
            "selective_half": layer_input + cached / 2}[mode]


def head_bytes(cfg, tokens: int, fused: bool,
               logits_bytes: float = Implementation.logits_bytes, elem: int = BF16,
               weight_copies: int = 2) -> float:
    """Peak bytes of the LM head + loss for ``tokens`` local tokens (module docstring), with
    ``weight_copies`` head weights besides the states (``head_weight_copies``): 2 under ZeRO-3
    (the weight gathered whole and its gradient), 1 in this project's engine (whose weight is
    among its states: its gradient), 0 where weights and gradients are whole in the states."""
    h, v = cfg.hidden_size, cfg.vocab_size
    if fused:
        acc = acc_bytes(elem)  # softmax and the weight gradient's sum (burst.engine.fused_loss)
        out = min(tokens, LOSS_CHUNK) * v * (elem + 2 * acc) + v * h * acc + tokens * h * elem
    else:
        # logits_bytes counts fp32 tensors (the accumulators' dtype): a float64 model's are
        # float64 (plain_cross_entropy upcasts to acc_dtype), twice the bytes
        out = tokens * v * logits_bytes * acc_bytes(elem) / FP32 + tokens * h * elem
    return out + weight_copies * v * h * elem


def head_weight_copies(impl: Implementation) -> int:
    """``head_bytes``' weight copies of an implementation: none where every rank holds its
    weights and (fp32 main) gradients whole (Megatron's distributed optimizer: its states
    count them, and the head's weight gradient accumulates into its main gradient), the
    gathered weight and its gradient under ZeRO-3, the gradient alone in this project's engine
    (``sharded_states`` False: weights among its states, gradients made in the backward)."""
    if impl.replicated_bytes_per_param:
        return 0
    return 2 if impl.sharded_states else 1


def train_memory(hw: Hardware, cfg, *, shape: AttnShape, plan: Plan, world: int,
                 checkpointing: str, fused_head: bool, impl: Implementation,
                 params: int, offload: bool = False, world_sharded: bool = False,
                 layers: Sequence[int] | None = None) -> MemoryEstimate:
    """Peak bytes per rank of one training step (see the module docstring). ``layers``: the
    layers whose backward runs ``shape``'s attention (default every layer; a model whose
    window differs between layers prices each window on its own layers). Layer k's backward
    holds the checkpoints of layers 0..k and, in this project's engine, the gradients of the
    layers after it (whole, or their shards under fsdp_world): linear in k, so the first and
    the last of ``layers`` bound it."""
    b, n, e = shape.batch, shape.seq_len // world, shape.elem  # e: the model's dtype
    tokens = b * n
    layer_params = (params - vocab_params(cfg)) / cfg.num_layers
    states = (2 * e if offload else zero_bytes_per_param(e)) * params / world
    gathered = 2 * layer_params * e + layer_params * e
    if impl.replicated_bytes_per_param:  # weights + grads whole, only the optimizer sharded
        optimizer = 0 if offload else (zero_bytes_per_param(e) - 2 * e) * params / world
        # the profile's bytes are a 16-bit model's: its weight moves with the model's dtype,
        # its main gradient with the accumulators' (a float32 model holds 8, not 6, as the
        # step model's collectives send: a metamorphic audit saw its states below bf16's)
        whole = impl.replicated_bytes_per_param + (e - BF16) + (acc_bytes(e) - FP32)
        states = whole * params + optimizer
        gathered = 0.0
    if not impl.sharded_states and offload:
        raise ValueError("offload: this project's engine keeps its optimizer state on the GPU "
                         "(it has no ZeRO offload); a paper system (cell.paper) can offload")
    one_layer = checkpoint_bytes(cfg, tokens, checkpointing, e)
    checkpoints = cfg.num_layers * one_layer
    span = sorted(set(range(cfg.num_layers) if layers is None else layers))
    if not span or not 0 <= span[0] <= span[-1] < cfg.num_layers:
        raise ValueError(f"layers={layers!r}: not layers of {cfg.num_layers}")
    ends = sorted({span[0], span[-1]})
    # the layer's activations again, recomputed; without checkpointing they are already among
    # the checkpoints (every activation of every layer)
    layer_act = layer_activation_bytes(cfg, tokens, e)
    act = sum(layer_act.values()) if checkpointing != "none" else 0.0
    if checkpointing == "selective":  # the cached attention output and lse are replayed, not
        act -= layer_act["attention_out"] + layer_act["lse"]  # made again (among checkpoints)
    mlp_grads = 2 * tokens * cfg.ffn_size * e
    layer_peak = (act + mlp_grads
                  + _attention_buffers(shape, plan, world,
                                     estimated=impl.estimated_ring_buffers)
                  + _float64_scores(shape, plan, world))
    head = head_bytes(cfg, tokens, fused_head, impl.logits_bytes, e, head_weight_copies(impl))
    extra = impl.global_token_bytes * shape.seq_len
    if not impl.sharded_states:
        moments = _engine_moments(cfg, e, params, layer_params, checkpoints, head, layer_peak,
                                  world if world_sharded else 1, layers=ends)
        return _finish(max(moments, key=lambda m: sum(m.values())), hw)
    base = {"model_states": states, "checkpoints": checkpoints, "implementation": extra}
    moments = [{**base, "head": head}]  # the states are constant: a later layer holds more
    moments += [{**base, "checkpoints": (ends[-1] + 1) * one_layer,
                 "gathered_params": gathered, "layer_backward": layer_peak}]
    return _finish(max(moments, key=lambda m: sum(m.values())), hw)


def _engine_moments(cfg, e: int, params: int, layer_params: float, checkpoints: float,
                    head: float, layer_peak: float, shards: int = 1, *,
                    layers: Sequence[int] | None = None) -> list[dict]:
    """This project's engine (``Implementation.sharded_states`` False) holds its states whole,
    but not all of them all the time: ``Trainer`` sets every gradient to None before the
    forward, so the forward and the head hold the weights and AdamW's two moments (3 x e per
    parameter); the gradients grow in the backward as the checkpoints are freed (so the last
    layer's backward holds the head's gradient and its own besides the checkpoints, and the end
    of the backward holds every gradient and no checkpoint); the optimizer step then holds all
    four and foreach AdamW's sqrt of the second moment for every parameter (torch.optim.adamw,
    the default on CUDA), which is more than the gradient sync's one bucket
    (``burst.engine.parallel.GRAD_BUCKET_BYTES``).

    With ``shards`` G > 1 (``data_parallel="fsdp_world"``: torch's FSDP over every rank, one
    unit per decoder layer and a root unit, ``burst.engine.parallel``) each rank keeps 1/G of
    the weights, gradients and moments at rest, in fp32 for a 16-bit model (master weights; the
    gathered weights and gradients are in the model's dtype). The root unit (embedding, final
    norm, head) is gathered from the forward to the end of the backward, and its gradients stay
    whole until then; a decoder layer is gathered only while it runs, in the backward with the
    layer before it (FSDP's prefetch) and its own gradients before their reduce-scatter, as
    ZeRO-3's ``gathered`` above, and the reduce-scatter's input, the unit's gradients copied
    whole into one buffer of the reduce dtype (fp32 for a 16-bit model: torch's
    ``foreach_reduce``); the gradients' shards grow to 1/G by the end of the backward; the
    optimizer then steps its 1/G.

    A layer's moment is taken at each of ``layers`` (default the first and the last): layer k
    holds the checkpoints of layers 0..k and the gradients of the layers after it, whole or,
    under fsdp_world, their shards."""
    last = cfg.num_layers - 1
    ends = (0, last) if layers is None else layers
    one = e * params  # one copy of every parameter
    head_grad = cfg.vocab_size * cfg.hidden_size * e
    if shards > 1:
        m = master_bytes(e)  # the states' and the reduce-scatter's bytes per element
        shard = m * params / shards  # one state's shard (fp32 for 16-bit)
        root_params = params - cfg.num_layers * layer_params  # embedding, head, final norm
        root = root_params * e
        in_flight = 3 * layer_params * e  # two layers' weights and one layer's gradients
        return [
            {"model_states": 3 * shard, "gathered_params": root, "checkpoints": checkpoints,
             "head": head},
            *({"model_states": 3 * shard, "gathered_params": root + in_flight,
               "gradients": head_grad + (last - k) * layer_params * m / shards,
               "reduce_scatter": layer_params * m,
               "checkpoints": (k + 1) * checkpoints / cfg.num_layers,
               "layer_backward": layer_peak} for k in ends),
            {"model_states": 4 * shard, "gathered_params": root, "gradients": root,
             "reduce_scatter": root_params * m},
            {"model_states": 4 * shard, "optimizer_step": shard},
        ]
    return [
        {"model_states": 3 * one, "checkpoints": checkpoints, "head": head},
        *({"model_states": 3 * one, "gradients": head_grad + (last - k + 1) * layer_params * e,
           "checkpoints": (k + 1) * checkpoints / cfg.num_layers,
           "layer_backward": layer_peak} for k in ends),
        {"model_states": 4 * one, "optimizer_step": one},
    ]
