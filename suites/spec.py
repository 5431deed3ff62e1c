"""Sweep specs: a TOML file validated into frozen, typed dataclasses (issue 5, "Specs").

A sweep is data, never a flag per knob. The file (``suites/specs/*.toml``)::

    description = "..."
    workload = "attention"          # attention | train_step
    device = "cpu"                  # cpu | cuda
    dtype = "float32"
    warmup = 1
    repeats = 3
    baseline = "ring"               # the label speedups are computed against
    seq_lens = [2048, 4096]         # with world (or nodes x gpus_per_node): one scale
    world = 4
    [shape]                         # attention workload
    heads = 8
    head_dim = 64
    causal = true
    [[methods]]
    name = "burst"                  # registry name or import path package.module:function
    options = { backward = "ring" }
    label = "burst-ringbwd"         # optional; default: name[non-default options]
    [[methods]]
    paper = "loongtrain_usp"        # a paper method name, mapped in suites.paper_methods
    [[scales]]                      # optional, several (nodes x gpus_per_node, seq_lens)
    nodes = 4
    gpus_per_node = 8
    seq_lens = [1048576]
    [slurm]
    partition = "gpu"
    time_min = 60

A train_step spec names its model instead of a [shape]: ``model = "7b"``
(``burst.engine.configs``), or a model of its own, which rows show under ``model``'s name::

    workload = "train_step"
    model = "my-13b"
    [model_config]                  # burst.engine.configs.ModelConfig's fields
    hidden_size = 5120
    num_layers = 40
    ...                             # or: model_config = "config.json" (Hugging Face's)

Validation collects every problem of the file before it raises (submitit's style): each names
the field, the bad value, the rule and the valid choices. Problems that need the cells (a method
that cannot run a shape, a length the layout cannot split) are found by ``suites.cells``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from burst.flops import CHECKPOINTING
from burst.layout import divisors
from burst.masks import shown_window

__all__ = [
    "DEVICES",
    "DTYPES",
    "ONLY_FOR",
    "WORKLOADS",
    "MethodSpec",
    "Scale",
    "Shape",
    "SlurmSpec",
    "SpecError",
    "SweepSpec",
    "load_spec",
    "parse_spec",
    "spec_path",
]

WORKLOADS = ("attention", "train_step")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16", "float64")
SPEC_DIR = Path(__file__).parent / "specs"
SLURM_MIN_TIME_MIN = 3
"""A SLURM job's least time limit: submitit asks for its warning signal 90 s before the limit,
and SLURM may send it a minute early, so with 1 or 2 minutes it came at the job's start and
killed every rank ("User defined signal 2") before any cell ran."""
MAX_SEQ_LEN = 2**40  # tokens; sizes are int64 inside (2**70 crashed the masks' numpy)
MAX_WORLD = 2**20  # ranks, nodes or GPUs per node
MAX_HEADS = 2**16  # heads, kv heads or head_dim
MAX_COUNT = 2**31  # batch, warmup or repeats
MAX_TIMEOUT_MIN = 7 * 24 * 60  # a cell's time limit: a week (1e12 minutes overflowed timedelta)


class SpecError(ValueError):
    """Every problem of a spec at once; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str], source: str = "spec"):
        self.problems = list(problems)
        self.source = source
        n = len(self.problems)
        super().__init__(f"{source}: {n} problem{'s' * (n != 1)}:\n  - "
                         + "\n  - ".join(self.problems))


@dataclass(frozen=True)
class MethodSpec:
    """One method entry of a sweep (a column of the summary table)."""

    name: str
    """Registry name (``baselines.registry.names()``) or import path ``package.module:fn``."""
    label: str
    """Display label; unique in the sweep; the spec's ``baseline`` names one."""
    options: dict = field(default_factory=dict)
    """Method options (layout, backward, ranks_per_node, ulysses_degree, ...). The strings
    "@node" and "@world" stand for this cell's ranks per node and world size, "@world/4" for
    world // 4 (``suites.cells.placeholder_value``)."""
    checkpointing: str = "none"
    """train_step: none | full | selective | selective_half (``burst.flops.CHECKPOINTING``)."""
    fused_head: bool = False
    """train_step: fused LM head + loss (chunked logits)."""
    data_parallel: str | None = None
    """train_step: the engine's ``data_parallel`` (``CELL_DATA_PARALLEL``); None
    is its default, ddp. ``fsdp_world`` shards the model states over every rank."""
    paper: str | None = None
    """The paper's method name this entry reproduces (``suites.paper_methods``), if any."""
    skip_invalid: bool = False
    """Cells this method cannot run (its ``check`` fails for the shape, e.g. 40 heads over 32
    Ulysses ranks) become ``skipped`` rows instead of spec errors."""


@dataclass(frozen=True)
class Shape:
    """Attention shape (attention workload; train_step takes it from the model config)."""

    heads: int = 8
    """Query heads."""
    kv_heads: int = 0
    """Key/value heads (0: same as heads); heads % kv_heads == 0."""
    head_dim: int = 64
    """Head dimension."""
    causal: bool = True
    """Causal mask."""
    window: tuple[int, int] | None = None
    """(left, right) sliding window in tokens, passed to the method as ``window``."""

    def __post_init__(self):
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.window is not None:
            object.__setattr__(self, "window", tuple(self.window))

    def problems(self) -> list[str]:
        out = []
        if self.heads % self.kv_heads:
            out.append(f"shape.kv_heads: {self.kv_heads} does not divide heads={self.heads}; "
                       f"valid: {', '.join(map(str, divisors(self.heads)))}")
        if self.window is not None and (len(self.window) != 2 or min(self.window) < 0):
            out.append(f"shape.window: {list(self.window)} must be [left, right], both >= 0")
        return out


@dataclass(frozen=True)
class Scale:
    """One machine size and the sequence lengths run on it."""

    nodes: int
    """Nodes (GPU cluster) or simulated nodes (CPU: labels links intra/inter)."""
    ranks_per_node: int
    """GPUs (ranks) per node; world = nodes * ranks_per_node."""
    seq_lens: tuple[int, ...]
    """Global sequence lengths in tokens."""

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class SlurmSpec:
    """Resources asked of SLURM per cell (command-line flags override these)."""

    partition: str | None = None
    account: str | None = None
    time_min: int = 60
    """Time limit per cell (one job array element) in minutes."""
    constraint: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    mem_gb: int | None = None
    """Memory per node in GB (None: the partition's default)."""
    array_parallelism: int = 16
    """How many cells of a job array may run at once."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the sbatch script before srun (module load, venv activation)."""
    additional: dict = field(default_factory=dict)
    """Extra #SBATCH options passed through (submitit's additional_parameters)."""


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: what to run (methods x scales x lengths) and how to measure it."""

    name: str
    """Sweep name (default: the file's stem); results go to results/<name>/<run_id>/."""
    workload: str
    """attention (one layer forward+backward) | train_step (one engine training step)."""
    methods: tuple[MethodSpec, ...]
    scales: tuple[Scale, ...]
    description: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 1
    """Sequences per step."""
    shape: Shape | None = None
    """attention workload only."""
    model: str | None = None
    """train_step only: a ``burst.engine.configs`` name (tiny, 7b, 14b, ...), or the name of
    the model ``model_config`` defines."""
    model_config: dict | None = None
    """train_step only: the spec's own model, ``ModelConfig``'s fields (``dataclasses.asdict``;
    from a ``[model_config]`` table, or a Hugging Face config.json that ``model_config`` names);
    None: ``model`` is a built-in config."""
    window: tuple[int, int] | None = None
    """train_step only: the model's (left, right) sliding window (attention uses [shape])."""
    global_every: int | None = None
    """train_step only: every ``global_every``-th layer attends its whole causal context, the
    others ``window`` (``burst.masks.interleaved_windows``: 6 for Gemma 3); None: every layer
    has the window."""
    warmup: int = 1
    repeats: int = 3
    baseline: str | None = None
    """Label of the method speedups are computed against (None: no speedup column)."""
    seed: int = 0
    timeout_min: float = 20.0
    """A cell running longer than this becomes a ``timeout`` row (inline / local executors)."""
    error_max_tokens: int = 4096
    """Compute max_err against the float64 reference when seq_len <= this (0: never)."""
    profile_memory: bool = True
    """CPU: also measure the transient peak with the profiler (one extra untimed step)."""
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    source: str = ""
    """Path of the file the spec was read from."""
    source_args: tuple[str, ...] = ()
    """The ``burst-bench run`` arguments that made this sweep from that file (e.g.
    ``--data-parallel fsdp_world``): a resume command names them too."""

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("source")
        d.pop("source_args")
        for k in ("window", "global_every", "model_config"):  # (absent: specs before them)
            if d[k] is None:
                d.pop(k)
        return json.dumps(d, sort_keys=True, default=list)

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def on_nodes_of(self, gpus_per_node: int, most: int | None = None) -> SweepSpec:
        """The same sweep with every scale on nodes of ``gpus_per_node`` GPUs, the same world
        (a world below it: one node of the world's GPUs). Options tied to the node (``"@node"``
        placeholders) follow; named ``<name>-<gpus_per_node>gpn``, so its rows never mix with
        the spec's own. SpecError when a world does not split into such nodes (the valid sizes
        it lists stop at ``most``, the GPUs a node has)."""
        if (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                or gpus_per_node < 1):
            raise SpecError([f"gpus_per_node={gpus_per_node!r}: expected a whole number >= 1"],
                            self.name)
        scales, problems = [], []
        for sc in self.scales:
            rpn = min(sc.world, gpus_per_node)
            if sc.world % rpn:
                valid = [d for d in divisors(sc.world) if most is None or d <= most]
                problems.append(f"world {sc.world} does not split into nodes of {gpus_per_node} "
                                f"GPUs; valid: {', '.join(map(str, valid))}")
            scales.append(Scale(nodes=sc.world // rpn, ranks_per_node=rpn, seq_lens=sc.seq_lens))
        if problems:
            raise SpecError(sorted(set(problems)), self.name)
        return replace(self, name=f"{self.name}-{gpus_per_node}gpn", scales=tuple(scales))

    def as_this_engine(self) -> SweepSpec:
        """The same sweep with no paper system: each method keeps its options and its paper
        system's (already merged into them), and the simulator prices it as this project's
        engine runs it, which is what ``burst-bench run`` measures (``suites.simulate``: a
        cell without ``paper``). Named ``<name>-engine``, so its rows never mix with the
        spec's own."""
        return replace(self, name=f"{self.name}-engine",
                       methods=tuple(replace(m, paper=None) for m in self.methods))

    def with_data_parallel(self, data_parallel: str) -> SweepSpec:
        """The same train_step sweep with every method run under the engine's
        ``data_parallel`` (``CELL_DATA_PARALLEL``: ``fsdp_world``, the model states sharded over
        every GPU as the paper's ZeRO-3 systems do, or ``ddp``). Named
        ``<name>-<data_parallel>``, so its rows never mix with the spec's own. SpecError for an
        attention spec, another value, or a method that names another one itself (its label
        would say what did not run)."""
        problems = data_parallel_problems(data_parallel)
        if self.workload != "train_step":
            problems.append(f"data_parallel={data_parallel!r}: only train_step specs run the "
                            f"engine (this one's workload is {self.workload!r})")
        problems += [f"method {m.label!r} sets data_parallel = {m.data_parallel!r}; it would "
                     f"run under {data_parallel!r}" for m in self.methods
                     if m.data_parallel not in (None, data_parallel)]
        if problems:
            raise SpecError(problems, self.name)
        return replace(self, name=f"{self.name}-{data_parallel}",
                       source_args=(*self.source_args, "--data-parallel", data_parallel),
                       methods=tuple(replace(m, data_parallel=data_parallel)
                                     for m in self.methods))


# ---------------------------------------------------------------------------------------------
# Parsing with every problem collected

CELL_DATA_PARALLEL = ("ddp", "fsdp_world")
"""The engine's ``data_parallel`` values a cell can run (``burst.engine.parallel``): a cell's
ranks are one context-parallel group, so ``fsdp``, which shards over data-parallel replicas,
would run as ``ddp`` under another name."""


def data_parallel_problems(value) -> list[str]:
    """Why ``value`` is not a cell's data_parallel (empty when it is)."""
    if value in CELL_DATA_PARALLEL:
        return []
    why = (" (fsdp shards over data-parallel replicas, which a cell has none of: its ranks are "
           "one context-parallel group; fsdp_world shards over all of them)"
           if value == "fsdp" else "")
    return [f"unknown data_parallel {value!r}; valid: {', '.join(CELL_DATA_PARALLEL)}{why}"]


_TOP = {"name", "description", "workload", "device", "dtype", "batch", "shape", "model",
        "model_config", "window", "global_every",
        "methods", "seq_lens", "world", "nodes", "gpus_per_node", "scales", "warmup", "repeats",
        "baseline", "seed", "timeout_min", "error_max_tokens", "profile_memory", "slurm"}
_METHOD = {"name", "paper", "label", "options", "checkpointing", "fused_head", "data_parallel",
           "skip_invalid"}
_SHAPE = {"heads", "kv_heads", "head_dim", "causal", "window"}
# the cell keys that apply to one workload only, and which: the parser rejects them on the other
# one, and suites.simulate.as_cell does the same for a cell given in Python
ONLY_FOR = {**dict.fromkeys(sorted(_SHAPE), "attention"),
            **dict.fromkeys(("model", "model_config", "checkpointing", "fused_head",
                             "data_parallel"), "train_step")}
_SCALE = {"world", "nodes", "gpus_per_node", "seq_lens"}
_SLURM = {"partition", "account", "time_min", "constraint", "qos", "cpus_per_task", "mem_gb",
          "array_parallelism", "setup", "additional"}
_MISSING = object()


class _Reader:
    """Typed getters that record a problem (and return None) instead of raising."""

    def __init__(self):
        self.problems: list[str] = []

    def add(self, where: str, msg: str) -> None:
        if f"{where}: {msg}" not in self.problems:  # a value read twice is reported once
            self.problems.append(f"{where}: {msg}")

    def keys(self, table: dict, valid: set[str], where: str) -> None:
        for k in table:
            if k not in valid:
                near = difflib.get_close_matches(k, valid, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                if where and k in _TOP:  # written below a [table] header, so read into it
                    hint = (f" ({k!r} is a top-level key: TOML reads every key after a "
                            "[table] header into that table; move it above the first one)")
                self.add(f"{where}{k}", f"unknown key{hint}; valid keys: "
                         f"{', '.join(sorted(valid))}")

    def get(self, table: dict, key: str, where: str, kind, default=_MISSING, *,
            choices=None, minimum=None, maximum=None):
        name = f"{where}{key}"
        if key not in table:
            if default is _MISSING:
                extra = f"; valid: {', '.join(map(str, choices))}" if choices else ""
                self.add(name, f"required{extra}")
                return None
            return default
        v = table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
            want = " or ".join(k.__name__ for k in kinds)
            self.add(name, f"{v!r} is of type {type(v).__name__}; expected {want}")
            return None
        if choices is not None and v not in choices:
            near = difflib.get_close_matches(str(v), list(map(str, choices)), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            self.add(name, f"{v!r} is not valid{hint}; valid: {', '.join(map(str, choices))}")
            return None
        if isinstance(v, float) and not math.isfinite(v):
            self.add(name, f"{v!r} must be a finite number")
            return None
        if minimum is not None and v < minimum:
            self.add(name, f"{v!r} must be >= {minimum}")
            return None
        if maximum is not None and v > maximum:
            self.add(name, f"{v!r} must be <= {maximum}")
            return None
        return v

    def int_list(self, table: dict, key: str, where: str, default=_MISSING, minimum: int = 1,
                 maximum: int | None = None):
        v = self.get(table, key, where, list, default)
        if v is None or v is default:
            return v
        bad = [x for x in v if isinstance(x, bool) or not isinstance(x, int) or x < minimum
               or maximum is not None and x > maximum]
        if bad or not v:
            most = f" and <= {maximum}" if maximum is not None else ""
            self.add(f"{where}{key}", f"{v!r}: expected a non-empty list of integers >= "
                     f"{minimum}{most}")
            return None
        return tuple(v)


def _scale(r: _Reader, t: dict, where: str, seq_lens) -> Scale | None:
    world = r.get(t, "world", where, int, None, minimum=1, maximum=MAX_WORLD)
    nodes = r.get(t, "nodes", where, int, 1, minimum=1, maximum=MAX_WORLD)
    rpn = r.get(t, "gpus_per_node", where, int, None, minimum=1, maximum=MAX_WORLD)
    lens = r.int_list(t, "seq_lens", where, seq_lens, maximum=MAX_SEQ_LEN)
    if lens is None:
        if "seq_lens" not in t:
            r.add(f"{where}seq_lens", "required (here or at the top level)")
        return None
    if nodes is None:
        return None
    if rpn is None:
        if world is None:
            if "world" not in t:  # (a bad world has its own problem)
                r.add(f"{where}world", "give world, or nodes and gpus_per_node")
            return None
        if world % nodes:
            r.add(f"{where}nodes", f"{nodes} does not divide world={world}; valid: "
                  f"{', '.join(map(str, divisors(world)))}")
            return None
        rpn = world // nodes
    elif world is not None and world != nodes * rpn:
        r.add(f"{where}world", f"{world} != nodes x gpus_per_node = {nodes} x {rpn}; give "
              "either world or nodes and gpus_per_node")
        return None
    return Scale(nodes=nodes, ranks_per_node=rpn, seq_lens=lens)


def _method(r: _Reader, t: dict, where: str, workload: str) -> MethodSpec | None:
    from suites.paper_methods import PAPER_METHODS, paper_method

    r.keys(t, _METHOD, where)
    paper = r.get(t, "paper", where, str, None, choices=tuple(PAPER_METHODS))
    base = paper_method(paper) if paper else None
    # a misspelt paper method is reported once: its name, not given, is not missing too
    name = r.get(t, "name", where, str,
                 base.name if base else None if "paper" in t else _MISSING)
    options = r.get(t, "options", where, dict, {})
    ckpt = r.get(t, "checkpointing", where, str, base.checkpointing if base else "none",
                 choices=CHECKPOINTING)
    fused = r.get(t, "fused_head", where, bool, base.fused_head if base else False)
    dp = r.get(t, "data_parallel", where, str, None)
    for why in data_parallel_problems(dp) if dp is not None else ():
        r.add(f"{where}data_parallel", why)
    skip = r.get(t, "skip_invalid", where, bool, False)
    for k in sorted(k for k in t if ONLY_FOR.get(k, workload) != workload):
        r.add(f"{where}{k}", f"only applies to workload = {ONLY_FOR[k]!r}")
    if name is None or options is None or ckpt is None or fused is None:
        return None
    opts = {**(base.options if base else {}), **options}
    label = r.get(t, "label", where, str, None)
    if label is not None and not label.strip():
        r.add(f"{where}label", f"{label!r} is empty; give a name, or leave it out for the "
              "default")
        label = None
    elif label is not None and not label.isprintable():  # a newline split every table
        r.add(f"{where}label", f"{label!r} has a control character (a newline, a tab); give "
              "a name on one line")
        label = None
    if label is None:
        label = paper_label(base, name, options, ckpt, fused) if base else \
            default_label(name, options)
    return MethodSpec(name=name, label=label, options=opts, checkpointing=ckpt, fused_head=fused,
                      data_parallel=dp,
                      paper=paper, skip_invalid=bool(skip))


def paper_label(base, name: str, options: dict, ckpt: str, fused: bool) -> str:
    """The paper's label, with what the entry changes of the paper's system in brackets (the
    paper's label alone would match the published rows of another setup)."""
    changed = [f"name={name}"] if name != base.name else []
    changed += [f"{k}={v}" for k, v in sorted(options.items()) if base.options.get(k) != v]
    changed += [f"checkpointing={ckpt}"] if ckpt != base.checkpointing else []
    changed += [f"fused_head={str(fused).lower()}"] if fused != base.fused_head else []
    return f"{base.label} [{','.join(changed)}]" if changed else base.label


def default_label(name: str, options: dict) -> str:
    """name[k=v,...] of the options given (short, stable, unique for distinct options)."""
    short = name.rsplit(":", 1)[-1]
    if not options:
        return short
    return f"{short}[{','.join(f'{k}={v}' for k, v in sorted(options.items()))}]"


def parse_spec(data: dict, *, name: str, source: str = "spec",
               folder: str | Path = ".") -> SweepSpec:
    """Validate a parsed TOML document; raise SpecError listing every problem, those of the
    cells it expands to included (``suites.cells.cell_problems``), in one report. A relative
    ``model_config`` path is read from ``folder`` (``load_spec``: the spec file's)."""
    r = _Reader()
    r.keys(data, _TOP, "")
    workload = r.get(data, "workload", "", str, choices=WORKLOADS)
    device = r.get(data, "device", "", str, "cpu", choices=DEVICES)
    dtype = r.get(data, "dtype", "", str, "float32", choices=DTYPES)
    kw = {k: r.get(data, k, "", int, d, minimum=m, maximum=mx) for k, d, m, mx in
          (("batch", 1, 1, MAX_COUNT), ("warmup", 1, 0, MAX_COUNT), ("repeats", 3, 1, MAX_COUNT),
           ("seed", 0, 0, 2**32 - 1), ("error_max_tokens", 4096, 0, 2**62))}  # int64 inside
    kw["timeout_min"] = r.get(data, "timeout_min", "", (int, float), 20.0, minimum=0.01,
                              maximum=MAX_TIMEOUT_MIN)
    kw["profile_memory"] = r.get(data, "profile_memory", "", bool, True)
    kw["description"] = r.get(data, "description", "", str, "")
    name = r.get(data, "name", "", str, name)
    if isinstance(name, str) and not is_folder_name(name):
        given = "name" in data  # else the file's name
        r.add("name", f"{name!r}{'' if given else ' (the file name: no name set)'}: a sweep "
                      "name is one folder under results/ (letters, digits, '_', '.', '-'; not "
                      "starting with '.' or '-')" + ("" if given else '; set name = "..."'))

    shape, model, model_config = _shape_or_model(r, data, workload, dtype, Path(folder))
    window, global_every = _model_window(r, data, workload, model, model_config)
    methods, baseline, positions = _methods(r, data, workload, shape)
    scales = _scales(r, data)
    slurm = _slurm(r, data)

    if "scales" in data and not scales and not r.problems:
        r.add("scales", "no scale: give at least one [[scales]] entry")
    spec = None
    try:
        spec = SweepSpec(name=name, workload=workload, methods=tuple(methods),
                         scales=tuple(scales), device=device, dtype=dtype, shape=shape,
                         model=model, model_config=model_config, window=window,
                         global_every=global_every,
                         baseline=baseline, slurm=slurm, source=source, **kw)
    except (TypeError, ValueError):  # too broken to build: its own problems say why
        if not r.problems:
            raise
    if spec is not None and methods and scales:  # the cells' problems in the same report
        from suites.cells import cell_problems

        try:
            more = cell_problems(spec, {p.split(": ", 1)[-1] for p in r.problems},
                                 positions)
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # a broken [shape]
            more = [] if r.problems else [f"cells: {e}"]
        r.problems += [p for p in more if p not in r.problems]
    if r.problems:
        raise SpecError(r.problems, source)
    return spec


def _shape_or_model(r: _Reader, data: dict, workload, dtype, folder: Path):
    """The attention [shape] or the train_step model (its name, and its ``model_config`` where
    the spec defines it), each refused under the other workload (under a bad or missing
    workload, whichever the spec gives is checked all the same, so its problems come in the
    same round)."""
    shape = model = fields = None
    known = workload in ("attention", "train_step")
    if workload == "attention" or (not known and "shape" in data):
        shape = _shape(r, data)
    if workload == "train_step" or (not known and ("model" in data or "model_config" in data)):
        model = r.get(data, "model", "", str)
        if "model_config" in data:
            from burst.engine.configs import own_name_problem

            fields = _own_model(r, data["model_config"], folder)
            if model is not None and (why := own_name_problem(model)):
                r.add("model", why)
        elif model is not None:
            r.problems += _model_problems(model)
    for k in ("model", "model_config"):
        if workload == "attention" and k in data:
            r.add(k, "only applies to workload = 'train_step' (attention uses [shape])")
    if workload == "train_step":
        if "shape" in data:
            r.add("shape", "only applies to workload = 'attention' (train_step takes the "
                  "shape from the model config)")
        if dtype is not None:
            from burst.engine.trainer import dtype_problem

            if why := dtype_problem(dtype):
                r.add("dtype", why)
    return shape, model, fields


def _own_model(r: _Reader, given, folder: Path) -> dict | None:
    """A spec's ``model_config``: a table of ``ModelConfig``'s fields, or the path of a Hugging
    Face config.json (relative to ``folder``; ``burst.engine.config_from_file`` reads it) ->
    every field of the ModelConfig, as ``dataclasses.asdict`` gives them (the cells carry it,
    and their ids change with it), or None with the problem recorded."""
    from burst.engine.configs import ModelConfig, config_from_fields

    if isinstance(given, str):
        from burst.engine.hf import config_from_file

        try:
            return dataclasses.asdict(config_from_file(folder / given))
        except ValueError as e:
            r.add("model_config", f"{given!r}: {e}")
            return None
    if not isinstance(given, dict):
        r.add("model_config", f"{given!r} is of type {type(given).__name__}; expected a table "
              "of the model's fields or the path of a Hugging Face config.json")
        return None
    before = len(r.problems)
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    r.keys(given, names, "model_config.")  # each unknown key, with a guess at the one meant
    try:  # and the problems of the rest, in the same report
        fields = dataclasses.asdict(config_from_fields({k: v for k, v in given.items()
                                                        if k in names}))
    except ValueError as e:
        r.add("model_config", str(e))
        return None
    return None if len(r.problems) > before else fields


def _model_window(r: _Reader, data: dict, workload, model: str | None, fields: dict | None):
    """A train_step spec's ``window`` and ``global_every`` (top level; attention has [shape])."""
    if workload == "attention":
        for k in ("window", "global_every"):
            if k in data:
                r.add(k, "only applies to workload = 'train_step' (attention sets [shape] "
                      "window)")
        return None, None
    win = r.int_list(data, "window", "", None, minimum=0)
    if win is not None and len(win) != 2:
        r.add("window", f"{list(win)} must be [left, right] (two token counts)")
        win = None
    every = r.get(data, "global_every", "", int, None, minimum=1)
    if every is not None and win is None and "window" not in data:
        r.add("global_every", "needs window = [left, right], the local layers' window")
    layers = own = None
    if (every is not None or win is not None) and model is not None and (
            fields is not None or "model_config" not in data):
        from burst.engine.configs import resolve_config

        try:
            cfg = resolve_config(model, fields)
            layers, own = cfg.num_layers, cfg.window
        except ValueError:  # (the model's own problem is reported)
            pass
    if own is not None:  # the model's architecture has its window: a second one is a guess
        r.add("window" if win is not None else "global_every",
              f"model {model!r} has its own window ({shown_window(own)}); drop "
              "window and global_every")
        return None, None
    # a typo, not a pattern
    if every is not None and (every == 1 or (layers is not None and every > layers)):
        valid = ("2 to the model's layers" if layers is None else "2" if layers == 2 else
                 f"2 to {layers}")
        r.add("global_every", f"{every}: every layer would be "
              f"{'global (drop window)' if every == 1 else 'local (drop global_every)'}; " +
              (f"a model of {layers} layer cannot mix local and global layers" if layers == 1
               else f"give {valid}"))
    return win, every


def _shape(r: _Reader, data: dict) -> Shape | None:
    t = r.get(data, "shape", "", dict, {})
    if t is None:
        return None
    r.keys(t, _SHAPE, "shape.")
    vals = {k: r.get(t, k, "shape.", int, d, minimum=m, maximum=MAX_HEADS) for k, d, m in
            (("heads", 8, 1), ("kv_heads", 0, 0), ("head_dim", 64, 1))}
    vals["causal"] = r.get(t, "causal", "shape.", bool, True)
    win = r.int_list(t, "window", "shape.", None, minimum=0)
    if win is not None and len(win) != 2:
        r.add("shape.window", f"{list(win)} must be [left, right] (two token counts)")
        win = None
    vals["window"] = win
    if None in (vals["heads"], vals["kv_heads"], vals["head_dim"], vals["causal"]):
        return None
    shape = Shape(**vals)
    r.problems += shape.problems()
    return shape


def _methods(r: _Reader, data: dict, workload, shape):
    """The [[methods]] entries (with their options' problems, unique labels) and the baseline."""
    methods, positions = [], []
    raw = r.get(data, "methods", "", list)
    if raw is not None and not raw:
        r.add("methods", "empty; give at least one [[methods]] entry")
    for i, t in enumerate(raw or []):
        if not isinstance(t, dict):
            r.add(f"methods[{i}]", f"{t!r} is not a table; write [[methods]] entries")
            continue
        m = _method(r, t, f"methods[{i}].", workload or "attention")
        if m is not None:
            methods.append(m)
            positions.append(i)
    from suites.cells import option_problems  # unknown methods too, whatever else is wrong

    window = bool(shape and shape.window)
    for i, m in zip(positions, methods, strict=True):
        r.problems += option_problems(i, m, window)
    labels = [m.label for m in methods]
    for lab in sorted({x for x in labels if labels.count(x) > 1}):
        r.add("methods", f"label {lab!r} is used by {labels.count(lab)} methods; labels must be "
              "unique (give each a label)")
    baseline = r.get(data, "baseline", "", str, None)
    # (with an entry that could not be read, the baseline may be its label: not a second error)
    if baseline is not None and methods and len(methods) == len(raw) and baseline not in labels:
        r.add("baseline", f"{baseline!r} is not a method label; valid: {', '.join(labels)}")
    return methods, baseline, positions


def _scales(r: _Reader, data: dict) -> list:
    """The [[scales]] entries, or the one scale of the top-level machine size."""
    scales = []
    top_lens = r.int_list(data, "seq_lens", "", None, maximum=MAX_SEQ_LEN)
    if "scales" in data:
        for k in ("world", "nodes", "gpus_per_node"):
            if k in data:
                r.add(k, "give the machine size either at the top level or in [[scales]], "
                      "not both")
        given = r.get(data, "scales", "", list) or []
        for i, t in enumerate(given):
            if not isinstance(t, dict):
                r.add(f"scales[{i}]", f"{t!r} is not a table; write [[scales]] entries")
                continue
            r.keys(t, _SCALE, f"scales[{i}].")
            s = _scale(r, t, f"scales[{i}].", top_lens)
            if s is not None:
                scales.append(s)
        entries = [t for t in given if isinstance(t, dict)]
        if top_lens is not None and entries and all("seq_lens" in t for t in entries):
            r.add("seq_lens", "every [[scales]] entry gives its own seq_lens, so these are "
                  "never run: remove them, or leave seq_lens out of an entry to use them")
    else:
        s = _scale(r, {k: data[k] for k in _SCALE if k in data}, "", top_lens)
        if s is not None:
            scales.append(s)
    return scales


def _slurm(r: _Reader, data: dict) -> SlurmSpec:
    """The [slurm] table."""
    slurm = SlurmSpec()
    t = r.get(data, "slurm", "", dict, {})
    if t:
        r.keys(t, _SLURM, "slurm.")
        sk = {k: r.get(t, k, "slurm.", str, None) for k in
              ("partition", "account", "constraint", "qos")}
        sk.update({k: r.get(t, k, "slurm.", int, d, minimum=low) for k, d, low in
                   (("time_min", 60, SLURM_MIN_TIME_MIN), ("cpus_per_task", None, 1),
                    ("mem_gb", None, 1), ("array_parallelism", 16, 1))})
        setup = r.get(t, "setup", "slurm.", list, [])
        if setup and not all(isinstance(x, str) for x in setup):
            r.add("slurm.setup", f"{setup!r}: expected a list of shell lines (strings)")
        sk["setup"] = tuple(setup or ())
        sk["additional"] = r.get(t, "additional", "slurm.", dict, {}) or {}
        slurm = SlurmSpec(**sk)
    return slurm


def _model_problems(name: str) -> list[str]:
    from burst.engine.configs import get_config

    try:
        get_config(name)
    except (KeyError, ValueError) as e:
        return [f"model: {e}; or define the model in the spec: a [model_config] table of "
                "its fields, or model_config = \"<path of a Hugging Face config.json>\""]
    return []


def is_folder_name(name: str) -> bool:
    """One folder under results/ (a sweep name, a run id): letters, digits, '_', '.', '-',
    not starting with '.' or '-'."""
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) is not None


def spec_path(spec: str | Path) -> Path:
    """A spec file from a path, or from a name in suites/specs (``smoke`` -> smoke.toml)."""
    p = Path(spec)
    if p.is_dir():
        cand = SPEC_DIR / f"{spec}.toml"
        if "/" not in str(spec) and cand.exists():  # a bare name: the shipped spec, not a
            return cand  # results folder of the same name in the current directory
        raise ValueError(f"spec {spec!r} is a folder, not a spec file (TOML)")
    if p.exists():
        return p
    cand = SPEC_DIR / f"{spec}.toml"
    if cand.exists():
        return cand
    known = ", ".join(sorted(x.stem for x in SPEC_DIR.glob("*.toml")))
    raise ValueError(f"no spec file {spec!r}; give a path or one of: {known}")


def load_spec(spec: str | Path) -> SweepSpec:
    """Read and validate a spec file (path or name in suites/specs); SpecError lists every
    problem, including those of the cells it expands to (``suites.cells.cell_problems``)."""

    path = spec_path(spec)
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        # utf-8-sig: a byte-order mark (Windows editors) was "Invalid statement at line 1"
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError([f"not valid TOML: {e}"], str(path)) from None
    except UnicodeDecodeError as e:  # TOML is UTF-8: a binary or other-encoded file
        raise SpecError([f"not UTF-8 text, so not TOML ({e.reason} at byte {e.start})"],
                        str(path)) from None
    return parse_spec(data, name=path.stem, source=_shown(path), folder=path.parent)


def _shown(path: Path) -> str:
    """A spec's path as run.json records it: relative to the repository when inside it (the
    same on every machine), else absolute (a resume command printed from another folder
    still finds it)."""
    try:
        return str(path.resolve().relative_to(SPEC_DIR.parent.parent))
    except ValueError:
        return str(path.absolute())
