"""Named Llama-style model configs (issue 4): ``tiny`` for tests, the BurstEngine paper's 7B and
14B, Llama-3-8B and -70B, and Ministral-8B.

The harness and the simulator use these configs for FLOP and memory counts (``burst.flops``)
even where the model cannot be instantiated here, so every field is plain data.

    cfg = get_config("7b")
    param_count(cfg)          # 6_738_415_616, the Llama-2-7B count
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from burst.flops import mlp_matrices
from burst.layout import divisors
from burst.masks import model_window, shown_window

__all__ = ["CONFIGS", "ConfigError", "ModelConfig", "config_from_fields", "get_config",
           "own_name_problem", "param_count", "resolve_config", "run_window", "vocab_params"]


MAX_SIZE = 2**40
"""The largest count a config holds (widths, heads, vocabulary, max_seq_len), the harness's
longest sequence (``suites.spec.MAX_SEQ_LEN``): a spec's ``[model_config]`` with a digit too
many is refused, not priced (its byte counts passed int64 and broke the result table)."""

MAX_LAYERS = 1 << 16
"""The most layers a config holds. The engine, the FLOP counts and the simulator keep a list
entry per layer (``burst.masks.layer_windows``), so 2**40 layers exhausted the memory of the
simulating machine; the deepest published LLMs have a few hundred."""


class ConfigError(ValueError):
    """A ModelConfig's problems, each one also in ``problems`` (``burst.engine.hf`` names them
    by a config.json's keys)."""

    def __init__(self, problems: list[str]):
        super().__init__("ModelConfig: " + "; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only Llama-style model: RMSNorm, RoPE, SwiGLU MLP (or a plain GELU one),
    grouped-query attention."""

    hidden_size: int
    """Width of the residual stream."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Query heads; ``hidden_size`` must be a multiple of it (head_dim = hidden / heads)."""
    num_kv_heads: int
    """Key/value heads (GQA); must divide ``num_heads``. Equal to num_heads for MHA."""
    ffn_size: int
    """Inner width of the MLP (the SwiGLU's gate and up projections, the GELU MLP's up)."""
    vocab_size: int
    """Vocabulary size (embedding rows and LM-head outputs)."""
    rope_theta: float = 10000.0
    """RoPE base (Llama-2: 1e4, Llama-3: 5e5)."""
    rms_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the embedding matrix with the LM head."""
    gated_mlp: bool = True
    """SwiGLU MLP (gate, up, down: Llama's); False: a plain MLP of two matrices, up, exact GELU
    and down, as BurstEngine's own 7B config builds (``activate_fn: gelu``: thunlp/BurstEngine
    BurstEngine/apps/llama/config/7b/config.json, cpm/layers/feedforward.py)."""
    max_seq_len: int = 1 << 22
    """Longest global sequence (tokens) a run may use; the paper trains up to 4M tokens. RoPE
    tables are computed from position ids on the fly, so this is a guard, not a table size."""
    window: tuple | None = None
    """The architecture's sliding window (the model attends through it wherever it runs: alone,
    in a Trainer, in the FLOP counts): None, one (left, right) pair for every layer, or one
    entry per layer, each a pair or None (``burst.masks.layer_windows``; stored in
    ``model_window``'s form). Mistral's ``sliding_window`` and Ministral's ``layer_types``
    arrive here through ``burst.engine.hf``."""

    def __post_init__(self):
        problems, bad = [], set()  # every problem in one report; checks of a bad value skipped
        for f in fields(self):
            v = getattr(self, f.name)
            most = MAX_LAYERS if f.name == "num_layers" else MAX_SIZE
            if f.type in ("int", int) and (not isinstance(v, int) or isinstance(v, bool)
                                           or not 1 <= v <= most):
                shown = "2**40" if most == MAX_SIZE else str(most)
                problems.append(f"{f.name}={v!r} must be a positive integer <= {shown}")
                bad.add(f.name)
            if f.type in ("float", float):
                try:  # 1e6 and 1000000 are one model, and one cell id
                    x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
                        else math.nan
                except OverflowError:  # an int of 400 digits
                    x = math.inf
                if not 0 < x < math.inf:  # nan passed "v <= 0", and inf
                    problems.append(f"{f.name}={v!r} must be a positive number")
                else:
                    object.__setattr__(self, f.name, x)
            if f.type in ("bool", bool) and not isinstance(v, bool):
                problems.append(f"{f.name}={v!r} must be a bool")
        if not bad & {"hidden_size", "num_heads"} and self.hidden_size % self.num_heads:
            problems.append(f"hidden_size={self.hidden_size} is not divisible by num_heads="
                            f"{self.num_heads}; valid head counts: "
                            f"{_short(divisors(self.hidden_size))}")
        elif not bad & {"hidden_size", "num_heads"} and self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} (hidden_size / num_heads) must be even "
                            "for rotary embeddings")
        if not bad & {"num_heads", "num_kv_heads"} and self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads={self.num_heads} is not divisible by num_kv_heads="
                            f"{self.num_kv_heads}; valid kv head counts: "
                            f"{_short(divisors(self.num_heads))}")
        if self.window is not None and "num_layers" not in bad:
            try:  # hashable and comparable: sides as ints, a list of equal windows as one pair
                object.__setattr__(self, "window", model_window(self.window, self.num_layers))
            except ValueError as e:
                problems.append(str(e))
        if problems:
            raise ConfigError(problems)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _short(values: list[int]) -> str:
    return ", ".join(map(str, values)) if len(values) <= 12 else \
        ", ".join(map(str, values[:12])) + ", ..."


CONFIGS: dict[str, ModelConfig] = {
    # tests: every feature (GQA 2:1, untied head) at a size that runs in milliseconds on CPU
    "tiny": ModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64,
                        vocab_size=256, max_seq_len=1 << 16),
    # ~1.1B parameters: the GPU check's model (scripts/gpu_check.py), which fits one 80-141 GB
    # GPU with AdamW at 32K tokens, and at 128K with checkpointing
    "1b": ModelConfig(hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=16,
                      ffn_size=5632, vocab_size=32000),
    # BurstEngine paper (arXiv 2509.19836): LLaMA-7B and the 14B model, with the gated (SwiGLU)
    # MLP, not the non-gated one the official code builds (DESIGN.md 3)
    "7b": ModelConfig(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                      ffn_size=11008, vocab_size=32000),
    "14b": ModelConfig(hidden_size=5120, num_layers=40, num_heads=40, num_kv_heads=40,
                       ffn_size=13824, vocab_size=120000),
    # Meta Llama-3-8B (config.json of meta-llama/Meta-Llama-3-8B)
    "llama3-8b": ModelConfig(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                             ffn_size=14336, vocab_size=128256, rope_theta=500000.0,
                             rms_eps=1e-5),
    # Meta Llama-3-70B (config.json of meta-llama/Meta-Llama-3-70B; 70,553,706,496 parameters,
    # which param_count gives): a planning size for the simulator, too large to build here
    "llama3-70b": ModelConfig(hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                              ffn_size=28672, vocab_size=128256, rope_theta=500000.0,
                              rms_eps=1e-5),
    # Mistral AI's Ministral-8B (model card of mistralai/Ministral-8B-Instruct-2410: 36 layers,
    # 32/8 heads of 128, FFN 12288, vocabulary 131072, 8,019,808,256 parameters, which
    # param_count gives with an untied head; attention pattern "ragged (128k, 32k, 32k, 32k)",
    # i.e. one global layer then three with a window of 32768 keys, transformers'
    # MinistralConfig layer_types). rope_theta 1e8 and rms_eps 1e-5 are third-party listings,
    # not checked against its config.json; neither changes a FLOP, byte or memory count
    "ministral-8b": ModelConfig(hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                                ffn_size=12288, vocab_size=131072, rope_theta=1e8,
                                rms_eps=1e-5, window=(None, (32767, 0), (32767, 0),
                                                      (32767, 0)) * 9),
}


def get_config(name: str) -> ModelConfig:
    """The named config; ValueError listing the valid names otherwise."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; valid names: {', '.join(CONFIGS)}")
    return CONFIGS[name]


def config_from_fields(fields) -> ModelConfig:
    """A model a spec or a cell defines itself: a mapping of ``ModelConfig``'s fields (a spec's
    ``[model_config]`` table, a dict cell's), or a ModelConfig. ValueError naming the fields it
    does not have, those missing, or ModelConfig's own problems."""
    if isinstance(fields, ModelConfig):
        return fields
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    if not isinstance(fields, Mapping):
        raise ValueError(f"{fields!r} is of type {type(fields).__name__}; expected a table of "
                         f"the model's fields ({', '.join(names)})")
    problems = []
    if unknown := [k for k in fields if k not in names]:
        problems.append(f"unknown field {', '.join(map(repr, unknown))}; valid: "
                        f"{', '.join(names)}")
    if missing := [f.name for f in dataclasses.fields(ModelConfig)
                   if f.default is dataclasses.MISSING and f.name not in fields]:
        problems.append(f"missing {', '.join(missing)} (required)")
    if problems:
        raise ValueError("; ".join(problems))
    return ModelConfig(**fields)


def own_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model that a spec or a cell defines itself (None: it can):
    empty, or a built-in config's (rows would show two models as one)."""
    if not str(name).strip():
        return f"{name!r} is empty: name the model model_config defines (rows show the name)"
    if name in CONFIGS:
        return (f"{name!r} is a built-in config (burst.engine.configs); name the model "
                "model_config defines otherwise (rows show the name)")
    return None


def resolve_config(name: str, fields: dict | None = None) -> ModelConfig:
    """A spec's or a cell's model: the config its ``model_config`` defines (``ModelConfig``'s
    fields, as ``dataclasses.asdict`` gives them) where it has one, else the named config."""
    return get_config(name) if fields is None else ModelConfig(**fields)


def run_window(cfg: ModelConfig, window=None):
    """The window ``cfg``'s model runs when ``window`` is asked for (``Trainer(window=)``, a
    simulated cell's): the model's own (``cfg.window``) where ``window`` is None, else
    ``window`` in ``model_window``'s form. ValueError where the model has a window of its own
    and ``window`` differs from it (which one ran would be a guess), or where ``window`` is no
    window of its layers. The Trainer and the simulator's cells share this rule (a cell given
    in Python was priced without the model's window)."""
    if window is None:
        return cfg.window
    window = model_window(window, cfg.num_layers)
    if cfg.window is not None and window != cfg.window:
        raise ValueError(f"window {shown_window(window)} differs from the model's own "
                         f"({shown_window(cfg.window)}: model_config.window, e.g. a Mistral "
                         "checkpoint's sliding_window); give window=None, or a config with the "
                         "window to run (dataclasses.replace(config, window=...))")
    return window


def vocab_params(cfg: ModelConfig) -> int:
    """Parameters of the embedding and the LM head (one matrix when they are tied)."""
    return (1 if getattr(cfg, "tie_embeddings", False) else 2) * cfg.vocab_size * cfg.hidden_size


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters (embedding, layers, final norm, LM head unless tied)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_heads * d * 2 + h * cfg.num_kv_heads * d * 2  # q, o and k, v
    mlp = mlp_matrices(cfg) * h * cfg.ffn_size
    layer = attn + mlp + 2 * h  # two RMSNorm weights
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * h
    return cfg.vocab_size * h + cfg.num_layers * layer + h + head
