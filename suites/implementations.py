"""Implementation facts of the systems the paper compares, for the simulator (issue 6).

The registry method and its options say what algorithm a system runs (``suites.paper_methods``);
an ``Implementation`` adds what the algorithm does not fix but time and memory depend on: the
layout it balances causal work with, what its ring backward circulates and in which precision,
its attention speed relative to our schedule model, and buffers
it holds that grow with the whole sequence. Values live in ``suites/implementations.toml`` with a
source each; ``OURS`` describes this project's engine (no quirks).

    impl = implementation("megatron_cp")    # or implementation(None) -> OURS
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

__all__ = ["OURS", "PATH", "Implementation", "implementation", "implementations"]

PATH = Path(__file__).resolve().parent / "implementations.toml"


@dataclass(frozen=True)
class Implementation:
    name: str
    attention_efficiency: float = 1.0
    """Speed of its attention compute relative to the schedule model: every step's kernel time
    is divided by it, transfers are not (a step bound by its hop hides the slower compute)."""
    global_token_bytes: float = 0.0
    """Bytes per token of the whole sequence on every rank in its training runs (its framework's
    buffers; an attention layer alone holds none)."""
    logits_bytes: float = 8.0
    """Bytes per (token, vocab) logit a plain (unfused) head holds at the loss: fp32 logits and
    their fp32 gradient (a plain head materialises N/G x V logits; the frameworks upcast them
    for the loss)."""
    selective_caches_attention: bool = True
    """Whether its 'selective' checkpointing keeps the attention output (else it recomputes the
    whole layer, attention included, like 'full'; so does its 'selective_half')."""
    selective_regathers: bool = False
    """Whether its 'selective' checkpointing of Ulysses / USP runs their forward all-to-alls
    again in backward (their bytes and time counted): it keeps their kernel's head-sharded
    output and lse, gathers the q, k, v again and moves the output back again (this project's
    engine: burst/engine/checkpointing.py, burst/remake.py)."""
    replicated_bytes_per_param: float = 0.0
    """Bytes per parameter every rank holds whole in training, for a 16-bit model (Megatron's
    distributed optimizer shards only the fp32 optimizer state: bf16 weights 2 + fp32 main
    grads 4 = 6; ``memory_model.train_memory`` moves the weight's bytes with the model's dtype
    and the gradient's with the accumulators': 8 in float32); 0: ZeRO-3, weights and gradients
    sharded too."""
    vocab_size: int = 0
    """Vocabulary its training runs built (its tokenizer / model config); 0: the model's."""
    gelu_mlp_models: tuple[str, ...] = ()
    """Models (config names) its training runs built with a plain two-matrix GELU MLP instead
    of the config's SwiGLU (``ModelConfig.gated_mlp``): priced and counted as such, while a
    row's FLOPs and MFU stay the named model's, as the paper computes them."""
    sharded_states: bool = True
    """Whether its training runs shard the model states over the G ranks of a cell (ZeRO-3, or
    with ``replicated_bytes_per_param`` the optimizer alone). False: this project's engine
    (``burst.engine.Trainer``), which keeps the weights, their gradients and torch's AdamW
    moments whole on every rank of the context-parallel group, all in the model's dtype (no
    fp32 master copy), and sums the gradients over the group with all-reduces in buckets after
    the backward (``burst.engine.parallel.all_reduce_grads``); its default FSDP shards over
    data-parallel replicas, which a cell does not have (``suites.memory_model``: when it holds
    which). A cell's ``data_parallel="fsdp_world"`` shards them over every rank instead
    (priced as such: ``suites.memory_model._engine_moments``, ``suites.step_model``)."""
    estimated_ring_buffers: bool = False
    """Whether its ring's buffers are the estimate (one block and one set of accumulators in
    flight each way: two sets, three with a double ring) instead of those ``burst.ring``
    holds, counted (``suites.memory_model._attention_buffers``): the paper systems, whose own
    code holds others (docs/simulator.md, "What the model misses")."""
    optimizer_offload: bool = False
    """Its training runs keep the fp32 optimizer state (master weights, Adam moments) on the
    host and step the optimizer there (training cells only)."""
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        bad = []
        if not 0 < self.attention_efficiency <= 2:
            bad.append(f"attention_efficiency={self.attention_efficiency!r} must be in (0, 2]")
        for k in ("global_token_bytes", "logits_bytes", "replicated_bytes_per_param"):
            if getattr(self, k) < 0:
                bad.append(f"{k}={getattr(self, k)!r} must be >= 0")
        if self.vocab_size < 0:
            bad.append(f"vocab_size={self.vocab_size!r} must be >= 0 (0: the model's)")
        if isinstance(self.gelu_mlp_models, str) or not all(
                isinstance(m, str) for m in self.gelu_mlp_models):
            bad.append(f"gelu_mlp_models={self.gelu_mlp_models!r} must be a list of model names")
        else:
            object.__setattr__(self, "gelu_mlp_models", tuple(self.gelu_mlp_models))
        if bad:
            raise ValueError(f"implementation {self.name!r}: " + "; ".join(bad))

    def with_values(self, **values) -> Implementation:
        return replace(self, **values)

    def ran_checkpointing(self, mode: str) -> str:
        """The checkpointing mode its runs of ``mode`` really are: a 'selective' that caches
        no attention output recomputes whole layers, 'full' (their time, memory and hardware
        FLOPs are priced and counted so; the row keeps the mode it was asked for)."""
        if mode in ("selective", "selective_half") and not self.selective_caches_attention:
            return "full"
        return mode


# This project's engine. Its plain head (burst.engine.fused_loss.plain_cross_entropy: fp32
# logits into F.cross_entropy) peaks in the loss's backward with three fp32 tensors of N/G x V:
# log_softmax's saved output, its incoming gradient and the gradient it makes: 12 bytes a logit.
# Measured on an H200 (results/gpu/h200_20261204_cudnn, 1B model, 32K-128K tokens): reserved
# memory of the plain-head steps 1.04-1.46x the prediction with 8 bytes, 0.97-1.09x with 12
# (the fused-head steps 0.89-0.93x).
OURS = Implementation(name="burst-bench", selective_regathers=True, sharded_states=False,
                      logits_bytes=12.0)
_FIELDS = {f.name for f in fields(Implementation)} - {"name", "sources"}


def implementations(path: Path | str = PATH) -> dict[str, Implementation]:
    """Every implementation in the data file, by paper method name."""
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    out, problems = {}, []
    for name, table in raw.items():
        unknown = sorted(set(table) - _FIELDS - {"sources"})
        if unknown:
            problems.append(f"[{name}] unknown keys {unknown}; valid: {sorted(_FIELDS)}")
            continue
        try:
            out[name] = Implementation(name=name, **table)
        except (TypeError, ValueError) as e:
            problems.append(f"[{name}] {e}")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return out


_CACHE: dict[str, Implementation] | None = None


def implementation(paper: str | None) -> Implementation:
    """The implementation of a paper method name; ``OURS`` for None (this project's code)."""
    global _CACHE
    if paper is None:
        return OURS
    if _CACHE is None:
        _CACHE = implementations()
    if paper not in _CACHE:
        raise ValueError(f"no implementation profile for paper method {paper!r}; known: "
                         f"{', '.join(sorted(_CACHE))} (suites/implementations.toml)")
    return _CACHE[paper]
