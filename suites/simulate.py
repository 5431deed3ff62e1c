"""The paper-scale simulator: a cell (or a whole spec) on a hardware profile -> result rows.

    rows = simulate_spec("suites/specs/paper_main_7b.toml", "a800", out_dir="results/simulated")
    row = simulate_cell({"workload": "attention", "method": "burst", "seq_len": 1 << 20,
                         "world": 32, "ranks_per_node": 8, "heads": 40, "head_dim": 128,
                         "options": {"ranks_per_node": 8}}, "a800")

Rows follow ``results.schema`` with ``source="simulated"``, ``executor="simulate"`` and
``hardware`` = the profile, so tables and figures treat them like measured rows. A cell that a
real run could not start (a method that cannot split the shape) is an ``error`` row from
``simulate_cell``; ``simulate_spec`` refuses such a spec as a sweep does, unless the method has
``skip_invalid = true`` (then a ``skipped`` row, as a sweep records it). A cell whose predicted
peak exceeds the profile's usable memory is an ``oom`` row (with the predicted bytes).

How a prediction is made (docs/simulator.md): ``suites.schedule`` times one attention layer from
the kernel calls and the bytes of ``burst.volume``; ``suites.step_model`` builds the training step
around it; ``suites.memory_model`` counts the peak. A cell that names a paper system
(``cell.paper``) also gets that system's implementation facts (``suites.implementations``);
other cells are this project's engine.

Command line (the harness CLI ``burst-bench simulate`` calls the same functions):
    python -m suites.simulate SPEC [SPEC ...] --hardware a800 [--out results/simulated]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from burst import flops as F
from burst.masks import MaskSpec, per_layer
from suites.hardware import Hardware, load
from suites.implementations import OURS, Implementation, implementation
from suites.memory_model import MemoryEstimate, attention_memory, train_memory
from suites.schedule import (
    AttnShape,
    AttnTiming,
    Topo,
    acc_bytes,
    attention_timing,
    collective_seconds,
    plan_for,
    pricing_problem,
    regather_volume,
)
from suites.spec import ONLY_FOR, WORKLOADS
from suites.step_model import train_step_timing

__all__ = ["Prediction", "as_cell", "predict", "simulate_cell", "simulate_spec"]



@dataclass
class Prediction:
    status: str
    time_s: float | None = None
    attn: AttnTiming | None = None
    memory: MemoryEstimate | None = None
    error: str | None = None
    parts: dict = field(default_factory=dict)
    checkpointing: str | None = None
    """The checkpointing mode priced (train_step): a system whose 'selective' does not cache
    the attention output is priced as 'full'."""
    recompute: AttnTiming | None = None
    """The attention forward that backward runs again (full: the whole; selective_half: the
    first half of every rank's rows), whose bytes the row counts too."""
    regather: tuple = ()
    """Every rank's bytes sent again in a layer's backward by this project's selective Ulysses /
    USP (``suites.schedule.regather_volume``), rank 0's first; empty otherwise."""
    layers: tuple = ()
    """A model whose layers differ in window: (layers, the prediction of a model with that
    layer's window alone) per window (``predict``); empty otherwise."""


# ---------------------------------------------------------------------------------------------
# Cells


def _param_count(cfg) -> int:
    from burst.engine.configs import param_count

    return param_count(cfg)


_CELL_DEFAULTS = dict(sweep="adhoc", workload="attention", label=None, options=None, batch=1,
                      heads=None, kv_heads=None, head_dim=None, causal=True, window=None,
                      nodes=None, ranks_per_node=None, dtype="bfloat16", device="cuda",
                      warmup=0, repeats=1, seed=0, compute_error=False, profile_memory=False,
                      timeout_min=0.0, model=None, checkpointing="none", fused_head=False,
                      paper=None, data_parallel=None, model_config=None)


_MINIMUM = dict(seq_len=1, world=1, batch=1, heads=1, kv_heads=0, head_dim=1, nodes=1,
                ranks_per_node=1, repeats=1)  # kv_heads 0: as many as heads (the spec's rule)
_BOOLS = ("causal", "fused_head", "compute_error", "profile_memory")


def _check_field_types(d: dict) -> None:
    """A dict cell's counts and switches, checked as the spec parser checks them, with its
    caps (``causal="no"`` or ``fused_head="no"`` counted as true, ``world=0`` divided by zero,
    ``seq_len=2**64`` an OverflowError in numpy)."""
    from suites.spec import MAX_COUNT, MAX_HEADS, MAX_SEQ_LEN, MAX_WORLD

    most = dict(seq_len=MAX_SEQ_LEN, batch=MAX_COUNT, repeats=MAX_COUNT, heads=MAX_HEADS,
                kv_heads=MAX_HEADS, head_dim=MAX_HEADS, world=MAX_WORLD, nodes=MAX_WORLD,
                ranks_per_node=MAX_WORLD)
    bad = [f"{k}={d[k]!r} (expected an integer from {low} to 2**{most[k].bit_length() - 1})"
           for k, low in _MINIMUM.items()
           if d[k] is not None and (isinstance(d[k], bool) or not isinstance(d[k], int)
                                    or not low <= d[k] <= most[k])]
    bad += [f"{k}={d[k]!r} (expected True or False)" for k in _BOOLS
            if not isinstance(d[k], bool)]
    bad += [f"{k}={d[k]!r} (expected a name)" for k in ("dtype", "method")
            if not isinstance(d[k], str)]
    if bad:
        raise ValueError(f"cell field {'; '.join(bad)}")


def _model_fields(model: str, model_config, window) -> dict:
    """What a train_step cell's model decides: its own model's fields (``_cell_model_config``), its
    heads and head dim, and its window, the model's own where none is given, a second one
    refused (``burst.engine.configs.run_window``; a dict cell of ministral-8b was priced with no
    window at all, where a spec's cell has the model's)."""
    from burst.engine.configs import resolve_config, run_window

    fields = _cell_model_config(model, model_config)
    cfg = resolve_config(model, fields)
    try:
        window = run_window(cfg, window)
    except ValueError as e:
        raise ValueError(f"model {model}: {e}") from None
    return dict(model_config=fields, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim, window=window)


def _paper_defaults(d: dict) -> None:
    """A dict cell naming a ``paper`` system takes, where it gives none, the system's method,
    label and (a training step) checkpointing and fused head, as a spec's entry does
    (``suites.spec``); its options are merged in ``as_cell``."""
    from suites.paper_methods import paper_method
    from suites.spec import paper_label

    base = paper_method(d["paper"])
    train = (d.get("workload") or _CELL_DEFAULTS["workload"]) == "train_step"
    given = {k: d[k] for k in ("method", "checkpointing", "fused_head") if d.get(k) is not None}
    d.update({"method": base.name, **({"checkpointing": base.checkpointing,
                                        "fused_head": base.fused_head} if train else {}),
              **given})
    if d.get("label") is None:
        options = d.get("options") if isinstance(d.get("options"), Mapping) else {}
        d["label"] = paper_label(base, d["method"], options,
                                 d.get("checkpointing") or base.checkpointing,
                                 base.fused_head if d.get("fused_head") is None
                                 else d["fused_head"])


def as_cell(obj, gpus_per_node: int | None = None):
    """A ``suites.cells.Cell`` from a Cell, or from a dict / object with the cell's fields.

    Dicts may say ``method_options`` for ``options``, and give ``nodes`` or ``ranks_per_node``
    (the other follows from ``world``; with neither, nodes of ``gpus_per_node`` GPUs, or one
    node); train_step cells take heads and head_dim from the model.
    """
    from baselines.registry import plain_integer, plain_integers
    from suites.cells import Cell, resolve_options

    if isinstance(obj, Cell):  # a Cell made in Python too (dataclasses.replace of a spec's)
        if obj.workload != "train_step" or obj.model is None:
            return obj
        # its model's heads and window, as a dict cell's (a replaced model or model_config
        # kept the spec's heads: its row named them while another model was priced)
        model = _model_fields(obj.model, obj.model_config, obj.window)
        return obj if all(getattr(obj, k) == v for k, v in model.items()) else \
            dataclasses.replace(obj, **model)
    d = dict(obj) if isinstance(obj, dict) else {
        f.name: getattr(obj, f.name) for f in dataclasses.fields(Cell) if hasattr(obj, f.name)}
    d = plain_integers(d)  # a numpy count is the same count (as the registry's call takes it)
    if "method_options" in d:
        d["options"] = d.pop("method_options")
    if d.get("paper"):  # what a spec's [[methods]] entry takes from its paper system
        _paper_defaults(d)
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(Cell)})
    if unknown:
        raise ValueError(f"unknown cell fields {unknown}; valid: "
                         f"{sorted(f.name for f in dataclasses.fields(Cell))}")
    missing = [k for k in ("method", "seq_len", "world") if d.get(k) is None]
    if missing:
        raise ValueError(f"a cell needs {', '.join(missing)}")
    workload = d.get("workload") or _CELL_DEFAULTS["workload"]
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r} is not a workload; valid: "
                         f"{', '.join(WORKLOADS)}")
    # a key of the other workload would be ignored (the spec parser's rule, suites.spec.ONLY_FOR);
    # a default value ignores nothing. One exception: a training step's window is the model's
    # (the engine's Trainer(window=); a spec's top-level window and global_every)
    wrong = sorted(k for k, v in d.items() if ONLY_FOR.get(k, workload) != workload
                   and v is not None and v != _CELL_DEFAULTS[k]
                   and not (k == "window" and workload == "train_step"))
    if wrong:
        other = ONLY_FOR[wrong[0]]
        why = ("a train_step cell takes heads, kv_heads, head_dim and causal from its model"
               if workload == "train_step" else "an attention cell has no model, "
               "checkpointing or LM head")
        raise ValueError(f"{', '.join(f'{k}={d[k]!r}' for k in wrong)}: only for workload "
                         f"{other!r}, not {workload!r} ({why})")
    d = {**_CELL_DEFAULTS, **{k: v for k, v in d.items() if v is not None}}
    _check_field_types(d)
    if not isinstance(d["options"] or {}, Mapping):  # dict() read a list of pairs, or failed
        raise ValueError(f"options={d['options']!r}: expected a table of option names to values")
    d["options"] = plain_integers(dict(d["options"] or {}))
    if d["paper"]:  # the paper system's options under the cell's own, as a spec merges them
        from suites.paper_methods import paper_method

        d["options"] = {**paper_method(d["paper"]).options, **d["options"]}
    world, given_rpn = d["world"], d["ranks_per_node"]
    if given_rpn is not None and d["nodes"] is not None and d["nodes"] * given_rpn != world:
        raise ValueError(f"nodes={d['nodes']} x ranks_per_node={given_rpn} is not "
                         f"world={world}; give one of them")
    if d["ranks_per_node"] is None:
        if d["nodes"] is None and gpus_per_node:
            d["ranks_per_node"] = min(world, gpus_per_node)
        else:
            nodes = d["nodes"] or 1
            if world % nodes:
                raise ValueError(f"world={world} does not split over nodes={nodes}")
            d["ranks_per_node"] = world // nodes
    if d["ranks_per_node"] < 1 or world % d["ranks_per_node"]:
        if given_rpn is None and d["nodes"] is None:  # filled in from the profile
            raise ValueError(f"world={world} does not fill nodes of {d['ranks_per_node']} GPUs "
                             "(the hardware profile's); give nodes or ranks_per_node")
        raise ValueError(f"ranks_per_node={d['ranks_per_node']} does not divide world={world}")
    d["nodes"] = world // d["ranks_per_node"]
    d["options"] = resolve_options(d["method"], d["options"], d["ranks_per_node"], world)
    if d["workload"] == "train_step":
        if d["model"] is None:
            raise ValueError("a train_step cell needs model (a burst.engine.configs name, or "
                             "the name of the model its model_config defines)")
        # (a training step's window is the model's: the Trainer's rule; a spec refuses a
        # second one)
        d.update(_model_fields(d["model"], d["model_config"], d["window"]), causal=True)
    elif d["heads"] is None or d["head_dim"] is None:
        raise ValueError("an attention cell needs heads and head_dim")
    d["kv_heads"] = d["kv_heads"] or d["heads"]
    d["label"] = d["label"] or d["method"]
    if d["workload"] == "attention" and d["window"] is not None:
        MaskSpec(window=d["window"])  # the core's rule (a set's sides came in hash order)
        d["window"] = tuple(plain_integer(x) for x in d["window"])
    return Cell(**d)


def _cell_model_config(name: str, fields) -> dict | None:
    """A dict cell's ``model_config`` (a ModelConfig, or a dict of its fields) as a spec's
    cell carries it, every field (``dataclasses.asdict``), under the spec's rules for its
    name (``own_name_problem``)."""
    from burst.engine.configs import config_from_fields, own_name_problem

    if fields is None:
        return None
    if why := own_name_problem(name):
        raise ValueError(f"model={why}")
    try:
        return dataclasses.asdict(config_from_fields(fields))
    except ValueError as e:
        raise ValueError(f"model_config: {e}") from None


MODELLED_BACKENDS = ("auto", "cuda_sdpa", "flash_attn")
"""Kernel backends (``burst.kernel.BACKENDS``) the simulator prices: the fused GPU ones."""


def _impl(cell) -> Implementation:
    return implementation(cell.paper) if cell.paper else OURS


def _shape(cell) -> AttnShape:
    return AttnShape(batch=cell.batch, seq_len=cell.seq_len, heads=cell.heads,
                     kv_heads=cell.kv_heads, head_dim=cell.head_dim, causal=cell.causal,
                     dtype=cell.dtype,
                     window=tuple(cell.window) if cell.window else None)


def _cell_problem(cell) -> str | None:
    """Why the cell could not run (``suites.cells.cell_problem``: shape, layout, degrees,
    checkpointing), else None."""
    from suites.cells import cell_problem

    try:
        return cell_problem(cell)
    except (ValueError, TypeError) as e:
        return str(e)


# ---------------------------------------------------------------------------------------------
# Predictions


def predict(cell, hw: Hardware, impl: Implementation | None = None, *,
            invalid: str = "error", offload: bool = False,
            layers: tuple[int, ...] | None = None, timing: bool = True) -> Prediction:
    """Time, memory and status of one cell on ``hw`` (``impl`` overrides the cell's system).
    ``timing=False``: whether it runs and fits (status, error, memory), no time: what
    ``suites.longest`` searches with (a windowed ring's time plans its kernels' tiles, seconds
    a length at a million tokens per rank).

    A cell the code could not run is an ``invalid`` row (``simulate_spec`` passes "skipped",
    what the harness records for the cells of a ``skip_invalid`` method). ``offload`` keeps
    ZeRO-3's fp32 optimizer state on the host (train_step; Python API only: specs have no such
    knob yet); a system whose profile says ``optimizer_offload`` always does. ``layers``
    (train_step): the layers that run this cell's attention, for the memory peak
    (``suites.memory_model.train_memory``; default every layer)."""
    return _predict(as_cell(cell, hw.gpus_per_node), hw, impl, invalid=invalid,
                    offload=offload, layers=layers, timing=timing)


def _predict(cell, hw: Hardware, impl: Implementation | None, *, invalid: str, offload: bool,
             layers: tuple[int, ...] | None, timing: bool = True) -> Prediction:
    """``predict`` of a cell as given: ``_mixed_layers`` prices a model of each of its windows
    alone, which ``as_cell`` would give the model's own window again."""
    impl = impl or _impl(cell)
    if cell.workload == "train_step" and per_layer(cell.window):
        return _mixed_layers(cell, hw, impl, invalid=invalid, offload=offload, timing=timing)
    opts = dict(cell.options)  # a paper system's own options are in them (spec, as_cell)
    if cell.ranks_per_node > hw.gpus_per_node:
        # a spec without nodes puts its whole world on one node, as a measured run would
        return Prediction("error", error=f"{cell.ranks_per_node} ranks per node, but the "
                                         f"{hw.name} profile has {hw.gpus_per_node} GPUs per "
                                         "node (a spec sets nodes or gpus_per_node, a cell "
                                         "given in Python nodes or ranks_per_node)")
    offload = (offload or impl.optimizer_offload) and cell.workload == "train_step"
    if cell.data_parallel is not None and impl.sharded_states:
        return Prediction("error", error=f"data_parallel={cell.data_parallel!r} is this "
                                         "project's engine's; a system that shards its states "
                                         "(a paper system) is priced with its own sharding "
                                         "(simulate --engine prices the cell as this engine "
                                         "runs it)")
    world_sharded = cell.data_parallel == "fsdp_world" and cell.world > 1
    try:  # a profile that gives no peak for this dtype (or no host link) cannot price it
        hw.peak(cell.dtype, "attention"), hw.peak(cell.dtype, "gemm")
        if offload:
            hw.offload_seconds(1.0, 2)
    except ValueError as e:
        return Prediction("error", error=str(e))
    if cell.seq_len % cell.world:
        return Prediction(invalid, error=f"seq_len {cell.seq_len} is not divisible by world "
                                         f"{cell.world}")
    problem = _cell_problem(cell)
    if problem:
        return Prediction(invalid, error=problem)
    backend = cell.options.get("backend", "auto")
    if backend not in MODELLED_BACKENDS:
        return Prediction("error", error=f"backend {backend!r} is not modelled: the simulator "
                                         "prices fused GPU attention kernels (backend "
                                         f"{', '.join(map(repr, MODELLED_BACKENDS))}); 'torch' "
                                         "materialises every block's scores, 'cpu_flash' runs "
                                         "on the CPU")
    shape = _shape(cell)
    ckpt = impl.ran_checkpointing(cell.checkpointing)
    topo = Topo(cell.world, cell.ranks_per_node)
    try:
        plan = plan_for(cell.method, opts, topo, shape)
    except (ValueError, NotImplementedError) as e:
        return Prediction("error", error=str(e))
    if cell.workload == "attention":
        mem = attention_memory(hw, shape, plan, cell.world,
                               estimated_ring_buffers=impl.estimated_ring_buffers)
    else:
        cfg = cell.config()
        if impl.vocab_size:
            cfg = dataclasses.replace(cfg, vocab_size=impl.vocab_size)
        if cell.model in impl.gelu_mlp_models:
            cfg = dataclasses.replace(cfg, gated_mlp=False)
        params = _param_count(cfg)
        try:  # e.g. offload asked of this project's engine, which has none
            mem = train_memory(hw, cfg, shape=shape, plan=plan, world=cell.world,
                               checkpointing=ckpt, fused_head=cell.fused_head, impl=impl,
                               params=params, offload=offload, world_sharded=world_sharded,
                               layers=layers)
        except ValueError as e:
            return Prediction("error", error=str(e))
    unpriced = pricing_problem(plan, shape, topo)  # time past the simulator's reach
    if not mem.fits and (unpriced or not timing):
        return Prediction("oom", memory=mem, checkpointing=ckpt, error=_oom(mem, hw))
    if unpriced:
        return Prediction("error", memory=mem, checkpointing=ckpt, error=unpriced)
    if not timing:
        return Prediction("ok", memory=mem, checkpointing=ckpt)
    try:
        attn = attention_timing(hw, cell.method, opts, shape, topo,
                                acc_elem=acc_bytes(shape.elem),
                                efficiency=impl.attention_efficiency)
    except (ValueError, NotImplementedError) as e:
        return Prediction("error", error=str(e))
    half, regather = None, ()
    if cell.workload == "attention":
        time_s = attn.total_s
        parts = {"attention_forward": attn.forward_s, "attention_backward": attn.backward_s}
    else:
        if ckpt == "selective_half":
            half_shape = dataclasses.replace(shape, seq_len=shape.seq_len // 2)
            half = attention_timing(hw, cell.method, opts, half_shape, topo,
                                    acc_elem=acc_bytes(shape.elem),
                                    efficiency=impl.attention_efficiency)
        regather_s = 0.0
        if ckpt == "selective" and impl.selective_regathers and plan.kind in ("ulysses", "usp"):
            regather = tuple(regather_volume(cell.method, opts, shape, topo,
                                             acc_elem=acc_bytes(shape.elem), rank=r)
                             for r in range(cell.world))
            regather_s = collective_seconds(hw, regather[0].sent("forward"),
                                            plan.ulysses or cell.world, topo)
        step = train_step_timing(hw, cfg, shape=shape, topo=topo, attn=attn,
                                 checkpointing=ckpt, params=params, half_attn=half,
                                 offload=offload,
                                 sharded_params=not impl.replicated_bytes_per_param,
                                 sharded_states=impl.sharded_states,
                                 world_sharded=world_sharded, regather_s=regather_s)
        time_s, parts = step.total_s, step.parts
    again = None  # the attention forward backward runs again (its bytes count too)
    if cell.workload == "train_step":
        again = attn if ckpt == "full" else half if ckpt == "selective_half" else None
    if not mem.fits:
        return Prediction("oom", attn=attn, memory=mem, parts=parts, checkpointing=ckpt,
                          recompute=again, regather=regather, error=_oom(mem, hw))
    return Prediction("ok", time_s=time_s, attn=attn, memory=mem, parts=parts,
                      checkpointing=ckpt, recompute=again, regather=regather)


def _oom(mem, hw: Hardware) -> str:
    """An OOM row's error: what it holds against what it may, and its largest parts."""
    held, usable = mem.reserved_gib, mem.usable / 2**30
    digits = next((d for d in range(2, 10) if round(held, d) > round(usable, d)), 10)
    # a usable memory set in Python or by --headroom is not the profile's: say so
    lowered = " (usable_gib overridden)" if hw.sources.get("usable_gib") == "override" else ""
    return (f"predicted OOM: {held:.{digits}f} GiB reserved > {usable:.{digits}f} GiB usable on "
            f"{hw.name}{lowered}; {_largest(mem)}")


def _largest(mem, n: int = 3) -> str:
    """The largest parts of a predicted peak (what to cut when it does not fit), in GiB of
    allocated memory: "allocated, largest first: head 95.4, model_states 44.9, checkpoints
    32.2 GiB and 4 smaller parts"."""
    top = sorted(mem.parts.items(), key=lambda kv: -kv[1])
    named = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in top[:n])
    rest = len(top) - n
    more = f" and {rest} smaller part{'s' * (rest > 1)}" if rest > 0 else ""
    return f"allocated, largest first: {named} GiB{more}"


def _time(s: float) -> str:
    if s < 0.9995:  # under 1000 ms once rounded
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s" if s < 99.95 else f"{s:.1f} s"


def explain(p: Prediction) -> str:
    """Where a priced cell's time and memory go, on one line: an attention layer's forward and
    backward, each with its kernels' time (the rest waits on transfers); a training step's
    layers, LM head, optimizer and the collectives that overlap no compute, with the
    attention's share of the layers; then, for a cell that fits, the largest parts of its
    memory peak (an OOM row's error names them). An OOM row's times are those it would take
    were it to fit. Empty for a cell not priced."""
    if p.status not in ("ok", "oom") or p.memory is None or not p.parts:
        return ""
    unfit = " were it to fit" if p.status == "oom" else ""
    memory = f"; {_largest(p.memory)}" if p.status == "ok" else ""
    if "layers_forward" not in p.parts:  # an attention layer
        a = p.attn
        waits = (a.forward_s - a.compute_forward_s + a.backward_s - a.compute_backward_s
                 > 1e-9 * (a.forward_s + a.backward_s))
        return (f"forward {_time(a.forward_s)} (kernels {_time(a.compute_forward_s)}), backward "
                f"{_time(a.backward_s)} (kernels {_time(a.compute_backward_s)}){unfit}"
                f"{', the rest waiting on transfers' if waits else ''}{memory}")
    t = p.parts
    step = sum(t[k] for k in ("layers_forward", "layers_backward", "head", "optimizer",
                              "per_step_collectives"))
    return (f"step {_time(step)}{unfit}: layers forward {_time(t['layers_forward'])}, backward "
            f"{_time(t['layers_backward'])}, LM head and loss {_time(t['head'])}, optimizer "
            f"{_time(t['optimizer'])}, collectives that overlap no compute "
            f"{_time(t['per_step_collectives'])}; attention {_time(t['attention'])} of the "
            f"layers' (with its recomputed forward){memory}")


def _mixed_layers(cell, hw: Hardware, impl: Implementation, *, invalid: str,
                  offload: bool, timing: bool) -> Prediction:
    """A model whose layers differ in window, priced from a model of each window alone. A
    step's time is a sum of per-layer terms and terms a window does not change (head,
    optimizer, per-step collectives; ``suites.step_model``), so it is the layer-weighted mean
    of theirs, part by part; its peak memory is the largest of theirs, because a window
    changes only its layer's ring buffers and kernel working set, not what the other layers
    keep (``suites.memory_model``), each priced on the layers with that window (a layer's
    backward holds the checkpoints of the layers before it, and in this project's engine the
    gradients of those after it)."""
    counts = Counter(cell.window)
    groups = tuple((n, _predict(dataclasses.replace(cell, window=w), hw, impl, invalid=invalid,
                                offload=offload,
                                layers=tuple(i for i, x in enumerate(cell.window) if x == w),
                                timing=timing))
                   for w, n in counts.items())
    layers = sum(counts.values())
    for _, p in groups:
        if p.status not in ("ok", "oom"):  # the first reason a window's model cannot run
            return p
    worst = max((p for _, p in groups), key=lambda p: p.memory.reserved)
    parts = ({k: sum(n * p.parts[k] for n, p in groups) / layers for k in worst.parts}
             if all(p.parts for _, p in groups) else {})  # (an OOM past the planning cap: none)
    common = dict(memory=worst.memory, parts=parts, checkpointing=worst.checkpointing,
                  layers=groups)
    if worst.status == "oom":
        return Prediction("oom", error=worst.error, **common)
    return Prediction("ok", time_s=sum(n * p.time_s for n, p in groups) / layers if timing
                      else None, **common)


def _metrics(cell, hw: Hardware, p: Prediction) -> dict:
    # MFU as the harness reports it: against the bf16 peak, for 16-bit cells only
    mfu_peak = hw.peak_tflops if cell.dtype in F.MFU_DTYPES else None
    m = {"status": p.status, "error": p.error, "peak_tflops": mfu_peak}
    if p.memory is not None:
        m.update(mem_peak_bytes=int(p.memory.allocated), mem_reserved_bytes=int(p.memory.reserved))
    # the mode the system really ran (a "selective" that caches no attention is full)
    ckpt = p.checkpointing or cell.checkpointing
    # (layers, prediction) per window: one group, unless the layers' windows differ
    groups = p.layers or ((cell.config().num_layers
                           if cell.workload == "train_step" else 1, p),)
    if all(g.attn is not None for _, g in groups):

        def sent(phase=None, link=None) -> int:
            """Every layer's bytes on each rank, plus what its backward sends again (the
            forward it recomputes, the all-to-alls a selective Ulysses gathers again); the
            busiest rank's, as measured."""
            per_rank = [0] * cell.world
            for n, g in groups:
                again = [g.recompute.volumes if g.recompute is not None else (), g.regather]
                again = [v for v in again if v] if phase in (None, "forward") else []
                for r, v in enumerate(g.attn.volumes):
                    per_rank[r] += n * (v.sent(phase, link)
                                        + sum(a[r].sent("forward", link) for a in again))
            return max(per_rank)

        m.update(bytes_sent_forward=sent("forward"), bytes_sent_backward=sent("backward"),
                 bytes_sent_intra=sent(link="intra"), bytes_sent_inter=sent(link="inter"))
    if p.status != "ok":
        return m
    t = p.time_s
    m.update(time_s=t, time_s_min=t, time_s_max=t)
    # a training step's FLOPs are the model's as the spec defines it (results/paper_reference/
    # README.md: the paper's MFU convention), whatever vocabulary a system's time was priced with
    cfg = cell.config() if cell.workload == "train_step" else None
    rates = F.rate_columns(time_s=t, batch=cell.batch, seq_len=cell.seq_len, world=cell.world,
                           peak=mfu_peak, cfg=cfg, checkpointing=ckpt, heads=cell.heads,
                           head_dim=cell.head_dim, causal=cell.causal, window=cell.window)
    m.update({k: v for k, v in rates.items() if v is not None})
    return m


def simulate_cell(cell, hardware: str | Hardware, *, ctx=None, invalid: str = "error") -> dict:
    """One result row (``results.schema``) predicted for ``cell`` on ``hardware``."""
    return priced_cell(cell, hardware, ctx=ctx, invalid=invalid)[0]


def priced_cell(cell, hardware: str | Hardware, *, ctx=None,
                invalid: str = "error") -> tuple[dict, Prediction]:
    """``simulate_cell``'s row and the prediction it was made from (``explain`` reads it)."""
    from suites.provenance import code_provenance, no_host
    from suites.rows import RunContext, make_row

    hw = hardware if isinstance(hardware, Hardware) else load(hardware)
    cell = as_cell(cell, hw.gpus_per_node)
    if ctx is None:
        ctx = RunContext(run_id=f"simulate-{hw.name}", executor="simulate", sweep_spec="",
                         **code_provenance())
    host = no_host()
    p = predict(cell, hw, invalid=invalid)
    row = make_row(cell, _metrics(cell, hw, p), ctx, host=host)
    row.update(source="simulated", executor="simulate", hardware=hw.name, device="cuda",
               device_name=hw.description, device_count=cell.world)
    return row, p


def close_calls(rows: list[dict], usable_bytes: float, band: float) -> list[dict]:
    """The priced rows (ok or OOM) whose predicted reserved memory lies within ``band`` (a
    fraction) of ``usable_bytes``, either side: whether they fit is within the memory model's
    error."""
    return [r for r in rows if r["status"] in ("ok", "oom") and r.get("mem_reserved_bytes")
            and abs(r["mem_reserved_bytes"] / usable_bytes - 1) <= band]


def _close_call_note(rows: list[dict], hw: Hardware) -> str | None:
    """One line naming the cells whose fit or OOM is within the memory model's median error."""
    from suites.calibrate import memory_error

    err = memory_error()
    close = close_calls(rows, hw.usable_bytes, err[0]) if err else []
    if not close:
        return None
    cells = "; ".join(f"{r['label']} seq={r['seq_len']} world={r['world']} "
                      f"({'fits' if r['status'] == 'ok' else 'OOM'} at "
                      f"{r['mem_reserved_bytes'] / 2**30:.2f} GiB)" for r in close)
    return (f"note: {len(close)} cell(s) within {100 * err[0]:.2f}% of the {hw.usable_gib:.2f} "
            f"GiB usable on {hw.name}, the memory model's median error on the paper's published "
            f"memory (worst {100 * err[1]:.2f}%; results/simulator_fit.csv), so whether they "
            f"fit is not certain: {cells}. --headroom F prices every cell with a fraction F of "
            "the usable memory to spare")


def run_id(hw: Hardware) -> str:
    """The run folder of a spec's simulation on ``hw`` (replaced by the next one)."""
    return f"simulated-{hw.name}"


def simulate_spec(spec, hardware: str | Hardware, out_dir: str | Path | None = None,
                  on_row=None) -> list[dict]:
    """Rows for every cell of a spec (path, name in suites/specs, or a SweepSpec).

    With ``out_dir`` the rows are also written as a run folder of ``results.store``:
    ``out_dir/<sweep>/simulated-<hardware>/rows.jsonl`` + table.parquet / table.csv.
    ``on_row(row, prediction)`` is called as each cell is priced (the CLI's progress: a cell
    of tens of thousands of GPUs takes seconds to a minute)."""
    from suites.cells import expand
    from suites.provenance import code_provenance
    from suites.rows import RunContext
    from suites.spec import SweepSpec, load_spec

    sw = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    hw = hardware if isinstance(hardware, Hardware) else load(hardware)
    ctx = RunContext(run_id=run_id(hw), executor="simulate",
                     sweep_spec=sw.to_json(), **code_provenance())
    cells = expand(sw)
    rows = []
    for c in cells:
        row, p = priced_cell(c, hw, ctx=ctx, invalid="skipped")
        rows.append(row)
        if on_row is not None:
            on_row(row, p)
    if out_dir is not None:
        # the run.json of a measured run, so the table's speedup is filled against the baseline
        meta = {"sweep": sw.name, "run_id": ctx.run_id, "source": sw.source, "spec": sw.to_json(),
                "baseline": sw.baseline, "cells": [c.cell_id for c in cells],
                "executor": "simulate", "hardware": hw.name,
                # which file, and which values: a profile's name alone does not say them
                "hardware_profile": hw.provenance()}
        run_dir = Path(out_dir) / sw.name / ctx.run_id
        _same_profile_file(run_dir, hw)
        write_rows(rows, run_dir, meta)
    return rows


def _same_profile_file(run_dir: Path, hw: Hardware) -> None:
    """Refuse to replace the rows of one profile file with those of another file that carries
    the same name: they share ``simulated-<name>``, and the first one's rows went without a
    word (a CLI fuzz). The same file with new values replaces its rows, as a re-run should."""
    from results import store

    try:
        old = store.read_meta(run_dir).get("hardware_profile") or {}
    except (OSError, ValueError):  # no run yet, or a broken run.json (replaced whole)
        return
    if old.get("path") not in (None, hw.path):
        raise ValueError(f"{run_dir} holds the rows of hardware profile {hw.name!r} from "
                         f"{old['path']}; this one is {hw.path}: give it another name, or "
                         "remove that folder")


PROVENANCE_ONLY = ("date", "git_commit", "git_dirty")
"""Row fields a simulation of the same cells with the same numbers may change: when they are
all that differs, the stored run stays as it is (regenerating the committed simulations leaves
the tree clean; the rows keep the commit that first gave these numbers)."""


def _unchanged(rows: list[dict], run_dir: Path, meta: dict | None) -> bool:
    import json

    from results import store

    if not (run_dir / store.ROWS).exists():
        return False
    try:
        old, old_meta = store.read_rows(run_dir / store.ROWS), store.read_meta(run_dir)
    except ValueError:
        return False
    new = json.loads(json.dumps(rows, default=store._json_default))
    new_meta = json.loads(json.dumps(meta, default=store._json_default))

    def strip(r):
        return {k: v for k, v in r.items() if k not in PROVENANCE_ONLY}

    return ((meta is None or old_meta == new_meta) and len(old) == len(new)
            and all(strip(a) == strip(b) for a, b in zip(old, new, strict=True)))


def write_rows(rows: list[dict], run_dir: Path, meta: dict | None = None) -> Path:
    """Replace ``run_dir``'s rows with these (a simulation is re-run whole, never resumed),
    unless they differ from the stored ones in ``PROVENANCE_ONLY`` alone."""
    from results import store

    if _unchanged(rows, run_dir, meta):
        store.consolidate(run_dir)  # the tables, if they lag the rows (it writes nothing else)
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if meta is not None:
        store.write_meta(run_dir, meta)
    (run_dir / store.ROWS).unlink(missing_ok=True)
    for r in rows:
        store.append_row(run_dir / store.ROWS, r)
    store.consolidate(run_dir)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    from suites.cli import _PipeSafe

    # rows are printed as they are priced, before --out writes them: a reader that goes away
    # (`| head`) silences the output, never the rows (it lost them: a review)
    with contextlib.redirect_stdout(_PipeSafe(sys.stdout)):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="burst-bench simulate", description=__doc__.split(
        "\n")[0] + " (also: python -m suites.simulate). Exit 1 when a cell is an error row.")
    ap.add_argument("specs", nargs="+", help="spec files or names in suites/specs")
    ap.add_argument("--hardware", default="a800",
                    help="profile name (suites/hardware: a800, a100, h100, h200) or .toml "
                         "path; one per call (default: a800, the paper's cluster)")
    ap.add_argument("--out", default=None, help="results folder to write run folders into "
                    "(default: none; only the summary is printed)")
    ap.add_argument("--gpus-per-node", type=int, default=None,
                    help="place every scale on nodes of this many GPUs, the same world (the "
                         "rows go to sweep <name>-<N>gpn; default: the spec's placement)")
    ap.add_argument("--engine", action="store_true",
                    help="price every cell as this project's engine runs it, a paper system's "
                         "too (what `burst-bench run` would measure; the spec's paper systems "
                         "are priced as the paper ran them otherwise); rows go to sweep "
                         "<name>-engine")
    ap.add_argument("--data-parallel", default=None, metavar="{ddp,fsdp_world}",
                    help="train_step specs: every method under the engine's data_parallel, as "
                         "`burst-bench run --data-parallel` runs it (a paper system's cell "
                         "cannot take one: use it with --engine); rows go to sweep "
                         "<name>[-engine]-<value>")
    ap.add_argument("--longest", action="store_true",
                    help="for each method and scale, the longest sequence that fits (the "
                         "spec's seq_lens are ignored; suites.longest); --out writes the rows "
                         "at those lengths as sweep <name>-longest")
    ap.add_argument("--headroom", type=float, default=0.0, metavar="FRACTION",
                    help="keep this fraction of each GPU's usable memory free: a cell fits "
                         "when its predicted reserved peak is within the rest (the memory "
                         "model's worst error on the paper's published memory is 19.5%%, "
                         "docs/simulator.md); rows go to sweep <name>-headroom<F>; default 0")
    ap.add_argument("--explain", action="store_true",
                    help="under each priced cell, where its time and memory go (an attention "
                         "layer's kernels and transfer waits; a step's layers, head, optimizer "
                         "and collectives; the memory peak's largest parts)")
    raw = list(sys.argv[1:] if argv is None else argv)
    if sum(x == "--hardware" or x.startswith("--hardware=") for x in raw) > 1:
        ap.error("--hardware given more than once: one profile per run (the last one would "
                 "silently win); run again for another profile")
    a = ap.parse_args(argv)
    if a.out is not None and Path(a.out).exists() and not Path(a.out).is_dir():
        ap.error(f"--out {a.out} is a file, not a folder")
    from suites.spec import SpecError, load_spec

    errors = 0
    try:
        hw = load(a.hardware)
    except (OSError, ValueError) as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    if not 0 <= a.headroom < 1:
        ap.error(f"--headroom {a.headroom}: a fraction of the usable memory, 0 <= f < 1")
    if a.headroom:
        usable = hw.usable_gib * (1 - a.headroom)
        print(f"note: --headroom {a.headroom:g}: {usable:.2f} of the {hw.name} profile's "
              f"{hw.usable_gib:.2f} usable GiB counted")
        hw = hw.with_values(usable_gib=usable)
    if a.gpus_per_node is not None and a.gpus_per_node > hw.gpus_per_node:
        ap.error(f"--gpus-per-node {a.gpus_per_node}: the {hw.name} profile has "
                 f"{hw.gpus_per_node} GPUs per node")
    if hw.sources.get("attention_kernel.fwd_eta_max", "").startswith("assumed"):
        print(f"note: the {hw.name} profile's attention-kernel efficiency is assumed, not "
              f"calibrated on measurements (its sources: {hw.path}); read its numbers as "
              "estimates")
    specs = []  # every spec and its options checked before any is simulated or written
    for s in a.specs:
        try:
            spec = load_spec(s)
            if a.gpus_per_node is not None:
                spec = spec.on_nodes_of(a.gpus_per_node, hw.gpus_per_node)
            if a.headroom:  # its own sweep name: never over the rows of the full memory
                spec = dataclasses.replace(spec, name=f"{spec.name}-headroom{a.headroom:g}")
            if a.engine:
                spec = spec.as_this_engine()
            if a.data_parallel is not None:
                spec = spec.with_data_parallel(a.data_parallel)
            widest = max(sc.ranks_per_node for sc in spec.scales)
            if widest > hw.gpus_per_node:
                raise ValueError(f"a scale places {widest} GPUs on a node, but the {hw.name} "
                                 f"profile's nodes have {hw.gpus_per_node}; "
                                 f"--gpus-per-node {hw.gpus_per_node} places the same world on "
                                 "them")
        except (SpecError, ValueError) as e:
            print(f"simulate {s}: {e}", file=sys.stderr)
            return 2
        specs.append((s, spec))
    from suites.cells import expand

    def line(r: dict, width: int, fit=None) -> str:
        val = r["status"]
        if val == "ok" and r["workload"] == "attention":
            val = f"{r['attn_tflops']:.1f} TFLOP/s per GPU"
        elif val == "ok":
            mfu = r.get("mfu_model_flops_causal")  # 16-bit cells only
            val = f"{r['tokens_per_s']:.1f} tokens/s per GPU" + (
                f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
        elif r.get("error"):  # why it was not priced, on the console too (not only --out)
            val = f"{val}: {r['error'].splitlines()[0]}"  # whole: a cut one misleads
        if r["status"] == "ok" and fit is None:  # the room left, before a run books it
            held = r["mem_reserved_bytes"]
            val += (f", {held / 2**30:.1f} GiB reserved" if held >= 0.1 * 2**30
                    else f", {held / 2**20:.1f} MiB reserved")  # a small cell: not "0.0 GiB"
        if fit is not None:  # the longest fit, and why the next length on the grid is not one
            val = (f"longest fit, {val}, {r['mem_reserved_bytes'] / 2**30:.1f} GiB; "
                   f"at {fit.stop_len}: {fit.stop.splitlines()[0]}" if fit.seq_len
                   else f"nothing fits (shortest on the grid: {r['seq_len']}); {val}")
        seq = "-" if fit is not None and not fit.seq_len else r["seq_len"]
        return f"{r['label']:{width}s} seq={seq:>8} world={r['world']:>3d} {val}"

    def show(r: dict, p: Prediction, width: int, fit=None) -> None:
        print(line(r, width, fit), flush=True)
        if a.explain and (why := explain(p)):
            print(f"    {why}", flush=True)

    for s, spec in specs:
        if spec.device != "cuda":
            print(f"note: {spec.name} is a {spec.device} spec; priced on {hw.name} GPUs")
        try:
            # a long label keeps its column
            width = max([28, *(len(c.label) for c in expand(spec))])
            if a.longest:
                from suites.longest import longest_spec

                fits = longest_spec(spec, hw, a.out, on_fit=lambda f, w=width: show(
                    f.row, f.prediction, w, f))  # each as it is found
                rows, name = [f.row for f in fits], f"{spec.name}-longest"
            else:  # each row as it is priced
                rows = simulate_spec(spec, hw, a.out, on_row=lambda r, p, w=width: show(
                    r, p, w))
                name = spec.name
                if note := _close_call_note(rows, hw):
                    print(note)
        except (SpecError, ValueError) as e:
            print(f"simulate {s}: {e}", file=sys.stderr)
            return 2
        errors += sum(r["status"] == "error" for r in rows)
        where = (str(Path(a.out) / name / run_id(hw)) if a.out is not None
                 else "nothing written (--out keeps the rows)")
        print(json.dumps({"spec": s, "hardware": hw.name, "rows": len(rows), "written": where}))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
