"""A Llama-style decoder whose attention runs over a context-parallel group (issue 4).

RMSNorm, rotary position embedding (RoPE), grouped-query attention, SwiGLU MLP, tied or untied
LM head; parameter names follow Hugging Face's ``LlamaForCausalLM`` without the ``model.``
prefix, so checkpoints map one to one (``burst.engine.hf``).

Each rank holds a shard of the sequence in the attention method's layout. Everything except
attention is per token, so it runs on the shard as it is; RoPE takes the *global* position id of
every local token, which is what makes any layout (contiguous, zigzag, striped) exact. Attention
goes through ``AttentionCall`` (the method, its CP group and mask); layers run through
``burst.engine.checkpointing`` in the selected recomputation mode.

Shapes (suffix legend): B batch, S local tokens, E hidden size, H/Hk query/kv heads, D head dim,
V vocabulary; x_BSE hidden states, q_BSHD, k_BSHD, v_BSHD.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from burst.engine.attention_call import AttentionCall, BurstMethod
from burst.engine.checkpointing import ActivationCache, run_layer
from burst.engine.configs import ModelConfig
from burst.engine.fused_loss import (
    IGNORE_INDEX,
    LOSS_CHUNK,
    fused_linear_cross_entropy,
    plain_cross_entropy,
)
from burst.engine.init import init_rows, local_rows
from burst.first_order import first_order

__all__ = ["CausalLM", "DecoderLayer", "RMSNorm", "Rope", "apply_rope", "assign_whole",
           "rope_cos_sin"]


class _RMSNormFn(torch.autograd.Function):
    """Llama's RMSNorm, keeping for backward only its input and the per-row 1/rms (fp32).
    Written with autograd it also kept the normalized rows, and in bf16 an fp32 copy of the
    input in place of the input: a layer kept 13% (fp32) to 26% (bf16, the tiny model) more
    than suites.memory_model counts (tests/test_engine_model.py measures it)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        # statistics in fp32 (float64 for float64 runs), as Llama does; the product in x's dtype
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(acc)
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    @first_order
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        acc = rstd.dtype
        xhat = x.to(acc) * rstd
        dweight = None
        if ctx.needs_input_grad[1]:  # the forward's product used the rounded rows
            dweight = (dy.to(acc) * xhat.to(x.dtype).to(acc)).reshape(-1, x.shape[-1]).sum(0)
            dweight = dweight.to(weight.dtype)
        g = dy.to(acc) * weight.to(acc)  # d loss / d normalized rows
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), dweight, None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


@dataclass(frozen=True)
class Rope:
    """cos/sin tables of the local tokens, (B, S, 1, D) in the model dtype."""

    cos: torch.Tensor
    sin: torch.Tensor


def rope_cos_sin(positions_BS: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> Rope:
    """RoPE tables for global position ids. Angles are formed in float64: at a million tokens
    fp32 angles (pos * inv_freq) are off by up to ~0.1 rad; the tables are cast to ``dtype``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64,
                                             device=positions_BS.device) / head_dim))
    ang = positions_BS.to(torch.float64)[..., None] * inv_freq  # B S D/2
    emb = torch.cat([ang, ang], dim=-1).unsqueeze(2)  # B S 1 D (rotate-half convention)
    return Rope(emb.cos().to(dtype), emb.sin().to(dtype))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x_BSHD: torch.Tensor, rope: Rope) -> torch.Tensor:
    return x_BSHD * rope.cos + _rotate_half(x_BSHD) * rope.sin


class SelfAttention(nn.Module):
    """Projections of grouped-query attention; the attention itself is the CP method's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)

    def qkv(self, x_BSE: torch.Tensor, rope: Rope):
        b, s, _ = x_BSE.shape
        q = self.q_proj(x_BSE).view(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x_BSE).view(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x_BSE).view(b, s, self.num_kv_heads, self.head_dim)
        # three separate contiguous tensors: the selective cache recognises them by storage
        return apply_rope(q, rope).contiguous(), apply_rope(k, rope).contiguous(), v.contiguous()


class MLP(nn.Module):
    """SwiGLU, or with ``cfg.gated_mlp`` False up, exact GELU, down (BurstEngine's 7B)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.gated_mlp
        if self.gated:
            self.gate_proj = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.down_proj(F.gelu(self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer, split around the attention call so that checkpointing can
    recompute the parts on either side without re-running the ring."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def attention_inputs(self, x_BSE: torch.Tensor, rope: Rope):
        """(q_BSHD, k_BSHD, v_BSHD) of this layer, RoPE applied."""
        return self.self_attn.qkv(self.input_layernorm(x_BSE), rope)

    def finish(self, x_BSE: torch.Tensor, attn_BSHD: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP block."""
        b, s = attn_BSHD.shape[:2]
        h = x_BSE + self.self_attn.o_proj(attn_BSHD.reshape(b, s, -1))
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, x_BSE: torch.Tensor, rope: Rope, index: int, *, attention, mode: str,
                cache: ActivationCache, cu_seqlens=None) -> torch.Tensor:
        """The layer under checkpointing ``mode`` (``run_layer``). Called through the module,
        so that a wrapper's hooks (FSDP's per-layer gather and gradient reduce-scatter) run
        around the whole layer, its recomputation in backward included."""
        return run_layer(self, index, x_BSE, rope, attention=attention, mode=mode, cache=cache,
                         cu_seqlens=cu_seqlens)


@torch.no_grad()
def assign_whole(param: torch.Tensor, whole: torch.Tensor) -> None:
    """Set ``param`` to the values of ``whole`` (its whole shape, any device and dtype): a plain
    parameter is copied; a sharded one (FSDP's DTensor) takes only its own shard, sliced
    locally on every rank (no communication; the whole passes through the mesh's device one
    parameter at a time)."""
    if tuple(whole.shape) != tuple(param.shape):
        raise ValueError(f"assign_whole: shape {tuple(whole.shape)} for a parameter of shape "
                         f"{tuple(param.shape)}")
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):  # a leaf: the caller's tensor may be part of a graph
        whole = distribute_tensor(whole.detach().to(param.dtype), param.device_mesh,
                                  param.placements, src_data_rank=None)
    param.copy_(whole)


class CausalLM(nn.Module):
    """The decoder plus LM head. ``forward`` returns logits, or the loss when targets are given.

    Engine settings (set by the Trainer, defaults for a single process): ``attention`` (the
    AttentionCall, with the config's window), ``checkpointing`` (a
    ``burst.flops.CHECKPOINTING`` mode), ``fused_head`` and ``loss_chunk``; ``cache`` holds the
    selective modes' attention outputs between forward and backward, keyed by layer.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size,
                                                                 bias=False)
        method = BurstMethod()
        self.attention = AttentionCall(method, method.layout(), window=cfg.window)
        self.checkpointing = "none"
        self.fused_head = True
        self.loss_chunk = LOSS_CHUNK
        self.cache = ActivationCache()

    @torch.no_grad()
    def reset_parameters(self, seed: int, std: float = 0.02) -> None:
        """Deterministic init from ``seed`` alone: unit norms, and normal(0, std) matrices drawn
        in fp32 on the host in blocks of rows seeded per (seed, name, block)
        (``burst.engine.init``), so every rank, device, dtype and world size builds the same
        weights without communication. A sharded parameter (FSDP's DTensor) draws only the
        rows it holds: a model sharded before its init holds the values of one initialised
        whole, and each rank draws about 1/G of it.
        """
        from torch.distributed.tensor import DTensor

        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                assign_whole(p, torch.ones(p.shape))
                continue
            mine = local_rows(p)
            if mine is None:  # a placement other than Shard(0): draw whole, DTensor slices it
                assign_whole(p, init_rows(name, p.shape, seed, std, 0, p.shape[0]))
                continue
            if mine[0] == mine[1]:  # no rows here (a trailing empty chunk, a rank off the mesh)
                continue
            rows = init_rows(name, p.shape, seed, std, *mine)
            (p.to_local() if isinstance(p, DTensor) else p).copy_(rows)

    @classmethod
    def skeleton(cls, cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> CausalLM:
        """The model on the meta device: names, shapes and dtype, no storage. Give it storage
        with ``to_empty`` (after FSDP has sharded it, only each rank's shard), then values with
        ``reset_parameters`` or ``assign_whole``."""
        with torch.device("meta"):
            return cls(cfg).to(dtype=dtype)

    @classmethod
    def build(cls, cfg: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
              device="cpu") -> CausalLM:
        """A model allocated once, on ``device`` in ``dtype``, initialised from ``seed``."""
        model = cls.skeleton(cfg, dtype).to_empty(device=device)
        model.reset_parameters(seed)
        return model

    @property
    def head_weight(self) -> torch.Tensor:
        """LM head weight (V, E); the embedding matrix when tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def hidden_states(self, tokens_BS: torch.Tensor, positions_BS: torch.Tensor, *,
                      cu_seqlens=None) -> torch.Tensor:
        """Final-norm hidden states (B, S, E) of the local tokens."""
        cfg = self.config
        x = self.embed_tokens(tokens_BS)
        rope = rope_cos_sin(positions_BS, cfg.head_dim, cfg.rope_theta, x.dtype)
        # without autograd (evaluation) nothing is saved, so there is nothing to checkpoint
        mode = self.checkpointing if torch.is_grad_enabled() else "none"
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, i, attention=self.attention.for_layer(i), mode=mode,
                      cache=self.cache, cu_seqlens=cu_seqlens)
        return self.norm(x)

    def forward(self, tokens_BS: torch.Tensor, positions_BS: torch.Tensor,
                targets_BS: torch.Tensor | None = None, *, loss_scale: float = 1.0,
                cu_seqlens=None, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
        """Logits (B, S, V) without targets; with targets, loss_scale * the summed token loss
        (the Trainer passes 1 / global token count, so the result is this rank's share of the
        global mean)."""
        hid = self.hidden_states(tokens_BS, positions_BS, cu_seqlens=cu_seqlens)
        if targets_BS is None:
            return F.linear(hid, self.head_weight)
        h_TE, t_T = hid.reshape(-1, hid.shape[-1]), targets_BS.reshape(-1)
        if self.fused_head:
            return fused_linear_cross_entropy(h_TE, self.head_weight, t_T, chunk=self.loss_chunk,
                                              ignore_index=ignore_index, scale=loss_scale)
        return plain_cross_entropy(h_TE, self.head_weight, t_T, ignore_index=ignore_index,
                                   scale=loss_scale)
