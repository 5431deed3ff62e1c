"""Load weights from a Hugging Face transformers ``LlamaForCausalLM`` (state dict + config), or
from one of the architectures that are Llama's with a sliding window: ``MistralForCausalLM``
(one window for every layer) and ``MinistralForCausalLM`` (local and global layers, its
``layer_types``).

    model = from_hf(hf_model.state_dict(), hf_model.config)      # a CausalLM with those weights
    trainer = Trainer(model.config, state_dict=model.state_dict(), ...)

The engine's parameter names are Hugging Face's without the ``model.`` prefix, so the mapping is
a rename; what it checks is that the checkpoint fits: every expected key present with the
expected shape, no unknown keys, and no feature the engine does not implement (another
architecture, biases, rope scaling, a head_dim other than hidden / heads, a rope_theta that is
not positive). A sliding window becomes the config's ``window``, which the model then attends
through wherever it runs (alone, in a Trainer, in the FLOP counts); a Mistral config whose
``layer_types`` mix sliding and full layers is refused (transformers builds either model from
it, MistralForCausalLM or, through AutoConfig, Ministral's).
Every problem is listed at once, naming the key.
transformers is not imported: any object with LlamaConfig's attributes (or a dict) works, and
``config_from_file`` reads a config.json (a sweep spec's ``model_config = "..."``,
``scripts/train.py --model-config``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from burst.engine.configs import ConfigError, ModelConfig
from burst.engine.model import CausalLM

__all__ = ["config_from_file", "config_from_hf", "convert_hf_state_dict", "from_hf"]

# architectures that are the engine's Llama, the last two with a sliding window
MODEL_TYPES = ("llama", "mistral", "ministral")
LAYER_TYPES = ("sliding_attention", "full_attention")  # Ministral's layer_types
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")
# ModelConfig's fields by a config.json's keys, for its problems (hidden_size, vocab_size and
# rope_theta are both's)
HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
           "num_kv_heads": "num_key_value_heads", "ffn_size": "intermediate_size",
           "rms_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}


def _get(cfg, name, default=None):
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def config_from_hf(hf_config, *, max_seq_len: int | None = None) -> ModelConfig:
    """ModelConfig of a Hugging Face LlamaConfig; ValueError for features the engine lacks."""
    problems = []
    kind = _get(hf_config, "model_type")
    if kind not in (None, *MODEL_TYPES):  # e.g. a Qwen2 or Gemma checkpoint loaded silently
        problems.append(f"model_type={kind!r} is not supported; valid: {', '.join(MODEL_TYPES)}")
    window = _window(hf_config, kind, problems)
    rope = {}
    for name in ("rope_scaling", "rope_parameters"):  # (the latter wins, as before)
        given = _get(hf_config, name)
        if given is not None and not isinstance(given, Mapping):
            problems.append(f"{name}={given!r} must be a table of RoPE parameters (or null)")
        elif given:
            rope = given
    theta = next((t for t in (_get(hf_config, "rope_theta"), rope.get("rope_theta"))
                  if t is not None), 10000.0)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        problems.append(f"rope type {rope_type!r} is not supported (only 'default' RoPE)")
    for flag in ("attention_bias", "mlp_bias"):
        if _get(hf_config, flag, False):
            problems.append(f"{flag}=True is not supported (the engine's projections have no "
                            "bias)")
    dropout = _get(hf_config, "attention_dropout", 0.0) or 0.0
    if dropout != 0:  # HF applies it in training: fine-tuning here would train another model
        problems.append(f"attention_dropout={dropout!r} is not supported (the engine has no "
                        "dropout; load a config with 0.0)")
    act = _get(hf_config, "hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act={act!r} is not supported (SwiGLU uses 'silu')")
    hidden, heads = _get(hf_config, "hidden_size"), _get(hf_config, "num_attention_heads")
    head_dim = _get(hf_config, "head_dim")
    whole = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (hidden, heads))
    if head_dim is not None and whole and head_dim != hidden // heads:
        problems.append(f"head_dim={head_dim} differs from hidden_size / num_attention_heads = "
                        f"{hidden // heads}; the engine derives head_dim from them")
    if missing := [k for k in REQUIRED if _get(hf_config, k) is None]:
        problems.append(f"missing {', '.join(missing)} (required)")
    kv = _get(hf_config, "num_key_value_heads")  # absent: multi-head (0 is no head count)
    # values as given: ModelConfig checks each (rope_theta and rms_norm_eps positive numbers,
    # which it stores as floats; tie_word_embeddings a bool: "false" would have tied the head)
    kw = dict(hidden_size=hidden, num_layers=_get(hf_config, "num_hidden_layers"),
              num_heads=heads, num_kv_heads=heads if kv is None else kv,
              ffn_size=_get(hf_config, "intermediate_size"),
              vocab_size=_get(hf_config, "vocab_size"), rope_theta=theta,
              rms_eps=_get(hf_config, "rms_norm_eps", 1e-6),
              tie_embeddings=_get(hf_config, "tie_word_embeddings", False), window=window)
    if max_seq_len is not None:
        kw["max_seq_len"] = max_seq_len
    cfg = None
    if not missing:  # ModelConfig's own problems in the same report, named by the file's keys
        try:
            cfg = ModelConfig(**kw)
        except ConfigError as e:
            problems += [re.sub(r"\b(" + "|".join(HF_KEYS) + r")\b", lambda m: HF_KEYS[m[1]], p)
                         for p in e.problems]
    if problems:
        raise ValueError("config_from_hf: " + "; ".join(problems))
    return cfg


def config_from_file(path) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json at ``path`` (``config_from_hf``), as a
    sweep spec's ``model_config = "..."`` and ``scripts/train.py --model-config`` read it;
    ValueError saying why there is none (unreadable, not JSON, not an object, or a config the
    engine cannot build)."""
    path = Path(path)
    try:
        hf = json.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror or e})") from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"{path} is not a JSON config ({e})") from None
    except RecursionError:  # (json's decoder recurses: 100000 nested brackets)
        raise ValueError(f"{path} is not a JSON config (nested too deeply)") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path} holds a JSON {type(hf).__name__}, not a Hugging Face config "
                         "(an object)")
    try:
        return config_from_hf(hf)
    except TypeError as e:  # a value of the wrong kind that no check named
        raise ValueError(str(e)) from None


def _window(hf_config, kind, problems: list[str]):
    """The engine's window of an HF config: Mistral's ``sliding_window`` on every layer,
    Ministral's on its ``sliding_attention`` layers. HF lets a query see the keys of the last
    ``sliding_window`` positions, itself included (transformers' masking_utils,
    ``sliding_window_overlay``: kv_idx > q_idx - sliding_window): the engine's (W - 1, 0)."""
    if kind not in ("mistral", "ministral"):  # HF's Llama has no window: which would it be?
        size = _get(hf_config, "sliding_window")
        if size is not None:
            problems.append(f"sliding_window={size!r} is not read for model_type={kind!r} (only "
                            "for mistral and ministral); load a config without it, and give "
                            "the engine's Trainer(window=(left, 0)) if the model needs one")
        return None
    # a config.json without the key: transformers' MistralConfig and MinistralConfig default
    size = _get(hf_config, "sliding_window", 4096)
    types = _get(hf_config, "layer_types")
    layers = _get(hf_config, "num_hidden_layers")
    if types is not None:
        if (not isinstance(types, (list, tuple)) or len(types) != layers
                or any(t not in LAYER_TYPES for t in types)):
            problems.append(f"layer_types={types!r}: expected a list of {layers} entries (one "
                            f"per layer), each one of {', '.join(LAYER_TYPES)}")
            return None
        if kind == "mistral" and any(t != "sliding_attention" for t in types):
            # transformers' MistralForCausalLM ignores layer_types (the window on every layer)
            # while AutoConfig reads such a config.json as Ministral's (configuration_auto.py)
            problems.append("model_type='mistral' with layer_types that are not all "
                            "sliding_attention is two models in transformers: "
                            "MistralForCausalLM gives every layer the window, AutoModel reads "
                            "it as Ministral (the layer_types); set model_type='ministral' or "
                            "drop layer_types to say which")
            return None
    if size is None:
        if types is not None and "sliding_attention" in types:
            problems.append("layer_types name sliding_attention layers, but sliding_window is "
                            "None")
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        problems.append(f"sliding_window={size!r} must be a whole number of tokens >= 1")
        return None
    pair = (size - 1, 0)
    if types is None:  # Mistral's, and a Ministral config without layer_types: every layer
        return pair
    return [pair if t == "sliding_attention" else None for t in types]


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Engine parameter names and shapes (the same as a freshly built CausalLM's)."""
    # shapes only: a 7B config must not allocate 27 GB here
    return {k: tuple(v.shape) for k, v in CausalLM.skeleton(cfg).state_dict().items()}


def convert_hf_state_dict(state_dict: Mapping[str, torch.Tensor],
                          cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename an HF LlamaForCausalLM state dict to the engine's names, checking every key."""
    expected = _expected_shapes(cfg)
    out, problems = {}, []
    for key, t in state_dict.items():
        name = key[len("model."):] if key.startswith("model.") else key
        if name.endswith("rotary_emb.inv_freq"):  # a buffer older checkpoints carry
            continue
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue  # tied checkpoints may still list the head; the embedding is the weight
        if name not in expected:
            problems.append(f"unexpected key {key!r} (shape {tuple(t.shape)})")
            continue
        if tuple(t.shape) != expected[name]:
            problems.append(f"key {key!r} has shape {tuple(t.shape)}, the config needs "
                            f"{expected[name]}")
            continue
        out[name] = t
    missing = [("model." + k if k != "lm_head.weight" else k) for k in expected if k not in out]
    if missing:
        problems.append(f"missing keys: {', '.join(missing[:8])}"
                        + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))
    if problems:
        raise ValueError(f"state dict does not fit the config ({cfg.num_layers} layers, hidden "
                         f"{cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} heads, vocab "
                         f"{cfg.vocab_size}): " + "; ".join(problems))
    return out


def from_hf(state_dict: Mapping[str, torch.Tensor], hf_config, *,
            dtype: torch.dtype | None = None) -> CausalLM:
    """A CausalLM with the weights of an HF LlamaForCausalLM (dtype: the checkpoint's, unless
    given)."""
    cfg = config_from_hf(hf_config)
    sd = convert_hf_state_dict(state_dict, cfg)
    if dtype is None:
        dtype = next(iter(sd.values())).dtype
    model = CausalLM.skeleton(cfg)  # no second allocation: the parameters become the copies below
    model.load_state_dict({k: v.detach().to(dtype=dtype, copy=True) for k, v in sd.items()},
                          strict=True, assign=True)
    return model
