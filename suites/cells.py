"""A sweep expanded into cells: one (method x scale x sequence length) each, with a stable id.

``cell_id`` is a hash of the cell's canonical JSON (everything that defines the measurement, not
the sweep's name nor the time limit), so a resumed or repeated run recognises the cells it has
already done, and two sweeps that share a cell give it the same id.

``cell_problems`` checks every cell before anything runs: the method exists, its options are
names it accepts, the length splits over the ranks in the method's layout, and the method's own
``check`` (heads, degrees, ranks per node) passes. A method that cannot run *here* (missing
package, no GPU) is not a spec problem: it becomes a ``skipped`` row at run time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from suites.spec import MethodSpec, SweepSpec, data_parallel_problems

__all__ = ["Cell", "cell_problem", "cell_problems", "expand", "option_problems",
           "placeholder_value", "resolve_options", "stable_id"]


def stable_id(identity: dict) -> str:
    """The id of a measurement from what defines it: a hash of its canonical JSON (a cell's
    ``cell_id``; the GPU check's rows, ``scripts/gpu_check.py``)."""
    blob = json.dumps(identity, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    """Everything one measurement needs; JSON-serialisable (it travels to ranks and jobs)."""

    sweep: str
    workload: str
    method: str
    label: str
    options: dict
    seq_len: int
    batch: int
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    causal: bool
    window: tuple | None
    """(left, right); a train_step cell's may hold one entry per layer
    (``burst.masks.model_window``)."""
    world: int
    nodes: int
    ranks_per_node: int
    dtype: str
    device: str
    warmup: int
    repeats: int
    seed: int
    compute_error: bool
    profile_memory: bool
    timeout_min: float
    model: str | None = None
    checkpointing: str = "none"
    fused_head: bool = False
    paper: str | None = None
    data_parallel: str | None = None
    """train_step: the engine's data_parallel (None: its default; left out of the id then)."""
    model_config: dict | None = None
    """train_step: the spec's own model (``ModelConfig``'s fields) named ``model``; None: a
    built-in config (left out of the id then)."""
    index: int = field(default=0, compare=False)
    """Position in the sweep (display and ordering only, not part of the id)."""

    @property
    def seq_local(self) -> int:
        return self.seq_len // self.world

    def config(self):
        """The train_step cell's ``ModelConfig``: its own (``model_config``) or the named one."""
        from burst.engine.configs import resolve_config

        return resolve_config(self.model, self.model_config)

    def identity(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("sweep", "timeout_min", "index"):
            d.pop(k)
        for k in ("data_parallel", "model_config"):  # the ids of cells from before them stay
            if d[k] is None:
                d.pop(k)
        return d

    @property
    def cell_id(self) -> str:
        return stable_id(self.identity())

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=list)

    @classmethod
    def from_json(cls, s: str) -> Cell:
        d = json.loads(s)
        if d.get("window") is not None:  # a pair, or a model's one entry per layer
            d["window"] = tuple(tuple(w) if isinstance(w, list) else w for w in d["window"])
        if d.get("model_config") is not None:  # its window's pairs as tuples, as it was sent
            from burst.engine.configs import config_from_fields

            d["model_config"] = dataclasses.asdict(config_from_fields(d["model_config"]))
        return cls(**d)

    def describe(self) -> str:
        model = f" {self.model}" if self.model else ""
        return (f"{self.label}{model} seq={self.seq_len} world={self.world}"
                f"{f' ({self.nodes} nodes)' if self.nodes > 1 else ''}")


PLACEHOLDERS = "@node (ranks per node), @world (world size), either over K (@world/4: world // 4)"
_PLACEHOLDER = re.compile(r"@(node|world)(?:/([1-9][0-9]*))?")


def placeholder_value(value, ranks_per_node: int, world: int):
    """``value`` with a placeholder replaced by its number for this machine ("@node", "@world",
    or either over K, floored: "@world/4" is InternEvo's inner ring of cp/4); any other value
    unchanged. An unknown "@..." string raises ValueError."""
    if not (isinstance(value, str) and value.startswith("@")):
        return value
    m = _PLACEHOLDER.fullmatch(value)
    if m is None:
        raise ValueError(f"{value!r} is not a known placeholder; valid: {PLACEHOLDERS}")
    base = ranks_per_node if m[1] == "node" else world
    return base // int(m[2] or 1)


def resolve_options(method: str, options: dict, ranks_per_node: int, world: int) -> dict:
    """A cell's options on this machine: the placeholders ("@node", "@world", "@world/K")
    replaced by its numbers, and a node's ranks as ``ranks_per_node`` where the options leave
    it out but the method's registry entry has a default for it (double_ring: its inner ring is
    a node's; the entry's default, 2, serves a call outside a sweep, which knows no nodes)."""
    from baselines import registry

    try:
        defaults = registry.get(method).options
    except ValueError:  # an unknown method: its cell says so
        defaults = {}
    if "ranks_per_node" in defaults and "ranks_per_node" not in options:
        options = {**options, "ranks_per_node": "@node"}
    return {k: placeholder_value(v, ranks_per_node, world) for k, v in options.items()}


def _model_shape(spec: SweepSpec) -> tuple[int | None, int | None, int | None]:
    if spec.model is None:
        return None, None, None
    from burst.engine.configs import resolve_config

    cfg = resolve_config(spec.model, spec.model_config)
    return cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size // cfg.num_heads


def _model_window(spec: SweepSpec):
    """A train_step spec's window in a cell's form: None, one pair, or one entry per layer; a
    model with its own window (``ModelConfig.window``) has that one."""
    from burst.engine.configs import resolve_config
    from burst.masks import interleaved_windows, model_window

    cfg = resolve_config(spec.model, spec.model_config)
    if spec.window is None:
        return cfg.window
    layers = cfg.num_layers
    every = spec.global_every
    return model_window(spec.window if every is None
                        else interleaved_windows(spec.window, layers, every), layers)


def expand(spec: SweepSpec) -> list[Cell]:
    """The cells of a sweep, in order: scales, then sequence lengths, then methods (so that the
    methods of one length run side by side and a partial run is comparable)."""
    if spec.workload == "attention":
        heads, kv_heads, head_dim = spec.shape.heads, spec.shape.kv_heads, spec.shape.head_dim
        causal, window = spec.shape.causal, spec.shape.window
    else:
        (heads, kv_heads, head_dim), causal = _model_shape(spec), True
        window = _model_window(spec)
    cells = []
    for scale in spec.scales:
        for n in scale.seq_lens:
            for m in spec.methods:
                cells.append(Cell(
                    sweep=spec.name, workload=spec.workload, method=m.name, label=m.label,
                    options=resolve_options(m.name, m.options, scale.ranks_per_node,
                                            scale.world), seq_len=n, batch=spec.batch,
                    heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal,
                    window=window, world=scale.world, nodes=scale.nodes,
                    ranks_per_node=scale.ranks_per_node, dtype=spec.dtype, device=spec.device,
                    warmup=spec.warmup, repeats=spec.repeats, seed=spec.seed,
                    compute_error=spec.workload == "attention" and n <= spec.error_max_tokens,
                    profile_memory=spec.profile_memory and spec.device == "cpu",
                    timeout_min=spec.timeout_min, model=spec.model,
                    checkpointing=m.checkpointing if spec.workload == "train_step" else "none",
                    fused_head=m.fused_head and spec.workload == "train_step",
                    paper=m.paper, index=len(cells),
                    data_parallel=m.data_parallel if spec.workload == "train_step" else None,
                    model_config=spec.model_config))
    return cells


def _block_level(name: str, method) -> str:
    return (f"{name!r} is block-level ({method.description}); the harness times attention cores "
            "(q, k, v -> out) and the engine's attention; use its block_fn directly")


def mask_option_problems(options: dict) -> list[str]:
    """A sweep passes the mask to every call itself: a window or documents among a method's
    options would be a second, conflicting one."""
    return [f"{k}: not a method option in a sweep; give a sliding window as [shape] window = "
            "[left, right] (packed documents are not a sweep dimension)"
            for k in ("window", "cu_seqlens") if k in options]


def option_problems(i: int, m: MethodSpec, window: bool = False) -> list[str]:
    """Problems of a method entry itself: unknown method, option names it does not take
    (``window``: the sweep passes a sliding window to every call)."""
    from baselines import registry

    where = f"methods[{i}] ({m.label})"
    try:
        method = registry.get(m.name)
    except ValueError as e:
        return [f"{where}.name: {e}"]
    if method.level == "block":
        return [f"{where}.name: {_block_level(m.name, method)}"]
    out = []
    out += [f"{where}.options.{p}" for p in mask_option_problems(m.options)]
    given = (set(m.options) - {"window", "cu_seqlens"}) | ({"window"} if window else set())
    out += [f"{where}.options.{k}: {m.name!r} {msg}" for k, msg in method.option_problems(given)]
    for k, v in m.options.items():
        try:
            placeholder_value(v, 1, 1)
        except ValueError as e:
            out.append(f"{where}.options.{k}: {e}")
    return out


def cell_problem(cell: Cell) -> str | None:
    """Why this cell cannot run anywhere (shape, layout, degrees, checkpointing), or None.
    Availability on this machine (packages, GPU) is not a cell problem."""
    from baselines import registry
    from burst.layout import LAYOUTS, length_problem

    method = registry.get(cell.method)
    if method.level == "block":
        return _block_level(cell.method, method)
    dtypes = method.dtypes_for(cell.options)
    if dtypes is not None and cell.dtype not in dtypes:
        return f"{cell.method!r} computes in {' or '.join(dtypes)}, not {cell.dtype}"
    masks = mask_option_problems(cell.options)
    if masks:
        return f"option {masks[0]}"
    if "backend" in cell.options:  # every cell of the spec failed at run time with it
        from burst.kernel import backend_problem

        if why := backend_problem(cell.options["backend"], cell.device):
            return f"option {why}"
    given = set(cell.options) | ({"window"} if cell.window is not None else set())
    unknown = method.option_problems(given)
    if unknown:
        return f"{cell.method!r} {unknown[0][1]}"
    layout = method.layout(cell.options)
    why = length_problem(cell.seq_len, cell.world, layout) if layout in LAYOUTS else None
    if why:
        return why
    if cell.workload == "train_step":
        from burst.engine.checkpointing import check_mode
        from burst.engine.trainer import dtype_problem, seq_len_problems

        try:
            check_mode(cell.checkpointing, layout, method)
        except ValueError as e:
            return str(e)
        limit = cell.config().max_seq_len
        if cell.seq_len > limit:
            return (f"seq_len {cell.seq_len} exceeds the max_seq_len {limit} of model "
                    f"{cell.model!r}")
        if why := dtype_problem(cell.dtype):
            return why
        why = seq_len_problems(cell.config(), cell.seq_len, cp_size=cell.world,
                               layout=layout, checkpointing=cell.checkpointing)
        if why and layout in LAYOUTS:
            return why[0]
        if cell.data_parallel is not None:
            why = data_parallel_problems(cell.data_parallel)
            if why:
                return why[0]
    if cell.heads is None:
        return None
    portable = dataclasses.replace(method, unavailable=lambda: None)
    try:
        portable.check(world=cell.world, heads=cell.heads, kv_heads=cell.kv_heads,
                       seq_local=cell.seq_local, causal=cell.causal, **cell.options)
    except ValueError as e:
        return str(e)
    return None


def cell_problems(spec: SweepSpec, reported: Collection[str] = (),
                  positions: Sequence[int] | None = None) -> list[str]:
    """Every problem of every cell, deduplicated, in method order (``parse_spec`` already
    reported the method entries' own problems; here they only guard the cell checks). Cells of
    a method with ``skip_invalid`` are not problems: they become ``skipped`` rows at run time.
    A cell that appears twice (repeated seq_lens or scales) is a problem: it would be measured
    twice under one id. A cell's problem among ``reported`` (what the spec's fields already
    said: a bad dtype, data_parallel) is not said again for every method."""
    cells = expand(spec)
    out: list[str] = []
    seen: set[str] = set()
    labels = [m.label for m in spec.methods]
    unique_labels = len(set(labels)) == len(labels)  # else parse_spec names the labels
    for c in cells:
        if c.cell_id in seen and unique_labels:
            msg = (f"seq_len@world {c.seq_len}@{c.world} appears more than once (repeated "
                   "seq_lens or scales): each cell would be measured twice under one id")
            if msg not in out:
                out.append(msg)
        seen.add(c.cell_id)
    for j, m in enumerate(spec.methods):
        # the entry's index in the file (``positions``: an entry that could not be read is
        # not in spec.methods, and the entries after it were named one index too low)
        i = positions[j] if positions is not None else j
        mine = [c for c in cells if c.label == m.label]
        probs = option_problems(i, m, bool(spec.shape and spec.shape.window))
        if not probs and not m.skip_invalid:
            where: dict[str, list[str]] = {}  # one line per distinct problem, with its cells
            for c in mine:
                p = cell_problem(c)
                if p is not None and p not in reported:
                    where.setdefault(p, []).append(f"{c.seq_len}@{c.world}")
            probs += [f"methods[{i}] ({m.label}) at seq_len@world {', '.join(at)}: {p}"
                      for p, at in where.items()]
        out += [p for p in probs if p not in out]
    return out
