"""BurstEngine: train a Llama-style model on sequences split over a context-parallel group.

- ``configs``: ModelConfig, the named configs (tiny, 7b, 14b, llama3-8b), param_count.
- ``model``: the decoder (RMSNorm, RoPE on global positions, GQA, SwiGLU, tied/untied head).
- ``init``: its seeded weight init, drawn in blocks of rows (a sharded rank draws its own).
- ``hf``: weights from a Hugging Face LlamaForCausalLM.
- ``attention_call``: the one path to the attention method, and its FLOP counter.
- ``checkpointing``: none / full / selective / selective_half recomputation.
- ``fused_loss``: chunked LM head + cross-entropy.
- ``data``, ``parallel``, ``trainer``: the data path, CP/DP groups and the training step.
- ``sharded_state``: the training state as every rank's own shards (``Trainer.save(...,
  sharded=True)``), torch.distributed.checkpoint folders behind a link.

The engine takes the attention method as an object (registry signature); it never imports
``baselines``.
"""

from burst.engine.attention_call import AttentionCall, BurstMethod, count_attention_flops
from burst.engine.checkpointing import CHECKPOINTING
from burst.engine.configs import CONFIGS, ModelConfig, get_config, param_count
from burst.engine.fused_loss import IGNORE_INDEX, fused_linear_cross_entropy
from burst.engine.hf import config_from_file, config_from_hf, convert_hf_state_dict, from_hf
from burst.engine.model import CausalLM
from burst.engine.parallel import make_groups
from burst.engine.trainer import Trainer

__all__ = [
    "CHECKPOINTING",
    "CONFIGS",
    "IGNORE_INDEX",
    "AttentionCall",
    "BurstMethod",
    "CausalLM",
    "ModelConfig",
    "Trainer",
    "config_from_file",
    "config_from_hf",
    "convert_hf_state_dict",
    "count_attention_flops",
    "from_hf",
    "fused_linear_cross_entropy",
    "get_config",
    "make_groups",
    "param_count",
]
