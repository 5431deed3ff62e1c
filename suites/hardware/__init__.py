"""Hardware profiles for the simulator: one TOML data file per cluster kind, values with sources.

    hw = load("a800")            # suites/hardware/a800.toml, or a path to any profile file
    hw.attn_seconds(flops, t, "forward")   # time of one attention kernel call
    hw.inter_gbps(senders_per_node=8)     # per-GPU bandwidth when 8 GPUs of a node cross nodes
    hw.sources["nic.efficiency"]         # where a number came from

Every value in a profile is ``{value = ..., source = "..."}``; the source says whether it is a
datasheet number, a measured range (DESIGN.md 4), an assumption, or calibrated against which
published numbers (``python -m suites.calibrate`` fits and can rewrite the calibrated ones).
Units are in the keys' names (TFLOP/s, GB/s per direction, microseconds, GiB); ``load`` refuses a
value far outside any real machine's range for its unit, as a value in another unit is.

Model of the attention kernel (issue 6, docs/simulator.md): a call whose smaller side has t
tokens runs at eta(t) = fwd_eta_max * t / (t + t_half_tokens) of the dense peak in forward and
bwd_over_fwd times that in backward. Small blocks lose to per-call prologue/epilogue and tail
effects; t_half_tokens is where half the peak efficiency is reached. A causal call (the diagonal
block) also loses its diagonal tiles' masked half: x (t + 1) / (t + causal_tile_tokens).
The dense peak is the one of the work's dtype (``Hardware.peak``); the efficiencies are
calibrated on 16-bit kernels and assumed to carry over to float32 and float64.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

__all__ = ["FIELDS", "OPTIONAL_FIELDS", "Hardware", "load", "names", "profile_path"]

_DIR = Path(__file__).resolve().parent

# (section.key, attribute, type): the keys every profile must give
FIELDS: tuple[tuple[str, str, type], ...] = (
    ("gpu.peak_bf16_tflops", "peak_tflops", float),
    ("gpu.memory_gib", "memory_gib", float),
    ("gpu.hbm_gbps", "hbm_gbps", float),
    ("gpu.gemm_efficiency", "gemm_efficiency", float),
    ("gpu.elementwise_efficiency", "elementwise_efficiency", float),
    ("attention_kernel.fwd_eta_max", "fwd_eta_max", float),
    ("attention_kernel.bwd_over_fwd", "bwd_over_fwd", float),
    ("attention_kernel.t_half_tokens", "t_half_tokens", float),
    ("attention_kernel.causal_tile_tokens", "causal_tile_tokens", float),
    ("nvlink.gbps_per_direction", "nvlink_gbps", float),
    ("nvlink.latency_us", "nvlink_latency_us", float),
    ("nic.per_node", "nics_per_node", int),
    ("nic.gbps_per_direction", "nic_gbps", float),
    ("nic.efficiency", "nic_efficiency", float),
    ("nic.latency_us", "nic_latency_us", float),
    ("node.gpus", "gpus_per_node", int),
    ("memory.usable_gib", "usable_gib", float),
    ("memory.allocator_overhead", "allocator_overhead", float),
)
# the peaks of the other dtypes: a profile without them still prices 16-bit cells; a float32 or
# float64 cell on it is an error row that names the missing value
OPTIONAL_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("gpu.peak_tf32_tflops", "peak_tf32_tflops", float),
    ("gpu.peak_fp32_tflops", "peak_fp32_tflops", float),
    ("gpu.peak_fp64_tflops", "peak_fp64_tflops", float),
    # the host side of optimizer offload (a cell without offload never needs them)
    ("host.pcie_gbps", "pcie_gbps", float),
    ("host.cpu_adam_params_per_s", "cpu_adam_params_per_s", float),
)
_FRACTIONS = ("gemm_efficiency", "elementwise_efficiency", "fwd_eta_max", "bwd_over_fwd",
              "nic_efficiency")
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """One GPU cluster kind. Bandwidths in GB/s (1e9 bytes/s) per direction, times in seconds."""

    name: str
    description: str
    peak_tflops: float
    """Dense bf16 peak per GPU, also the MFU denominator (DESIGN.md 4)."""
    memory_gib: float
    hbm_gbps: float
    gemm_efficiency: float
    """Fraction of peak reached by the model's dense GEMMs."""
    elementwise_efficiency: float
    """Fraction of HBM bandwidth reached by memory-bound elementwise kernels."""
    fwd_eta_max: float
    """Attention kernel forward efficiency for large blocks (fraction of peak)."""
    bwd_over_fwd: float
    t_half_tokens: float
    causal_tile_tokens: float
    """Tile side of the kernel: a causal call computes its diagonal tiles whole."""
    nvlink_gbps: float
    """Achievable point-to-point bandwidth between two GPUs of a node, per direction."""
    nvlink_latency_us: float
    nics_per_node: int
    nic_gbps: float
    """Line rate of one NIC per direction; ``nic_efficiency`` of it is achievable."""
    nic_efficiency: float
    nic_latency_us: float
    gpus_per_node: int
    usable_gib: float
    """Memory a process can allocate (capacity minus context and library workspaces)."""
    allocator_overhead: float
    """Reserved / allocated - 1 of the caching allocator (fragmentation, rounding)."""
    peak_tf32_tflops: float | None = None
    peak_fp32_tflops: float | None = None
    """FP32 on the CUDA cores (no tensor cores)."""
    peak_fp64_tflops: float | None = None
    pcie_gbps: float | None = None
    """Achievable host <-> GPU bandwidth per GPU, per direction (optimizer offload)."""
    cpu_adam_params_per_s: float | None = None
    """Parameters per second the host's Adam updates for one GPU's shard (optimizer offload)."""
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    path: str | None = field(default=None, compare=False, repr=False)
    """The file the profile was read from (``load``); None for one built in Python."""

    def __post_init__(self):
        bad = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("name", "description", "sources", "path") or v is None and f.name in {
                    attr for _, attr, _ in OPTIONAL_FIELDS}:
                continue
            # a bool is an int to Python, but true is no bandwidth: TOML says numbers as numbers
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                bad.append(f"{f.name}={v!r} must be a finite number >= 0")
            elif f.name in _FRACTIONS and not 0 < v <= 1:
                bad.append(f"{f.name}={v!r} must be a fraction in (0, 1]")
        for f in ("peak_tflops", "peak_tf32_tflops", "peak_fp32_tflops", "peak_fp64_tflops",
                  "pcie_gbps", "cpu_adam_params_per_s", "hbm_gbps", "nvlink_gbps", "nic_gbps",
                  "gpus_per_node", "nics_per_node", "memory_gib", "usable_gib"):
            if getattr(self, f) == 0:
                bad.append(f"{f}=0 must be positive")
        # a tile under one token would make a causal call more than fully efficient:
        # attn_efficiency's (t + 1) / (t + causal_tile_tokens) exceeds 1
        if isinstance(self.causal_tile_tokens, int | float) and self.causal_tile_tokens < 1:
            bad.append(f"causal_tile_tokens={self.causal_tile_tokens!r} must be >= 1 (tokens "
                       "per kernel tile)")
        if isinstance(self.allocator_overhead, int | float) and self.allocator_overhead >= 1:
            bad.append(f"allocator_overhead={self.allocator_overhead!r} must be below 1 (a "
                       "fraction of the allocated memory that the allocator reserves on top)")
        if self.usable_gib > self.memory_gib:
            bad.append(f"usable_gib={self.usable_gib} exceeds memory_gib={self.memory_gib}")
        if bad:
            raise ValueError(f"hardware profile {self.name!r}: " + "; ".join(bad))

    # -- compute --------------------------------------------------------------------------
    def peak(self, dtype: str = "bfloat16", work: str = "gemm") -> float:
        """Dense peak TFLOP/s per GPU for ``work`` ("gemm" or "attention") in ``dtype``.

        The efficiencies of the profile are fractions of these peaks. 16-bit: the tensor-core
        peak, both kinds of work. float32: GEMMs on the CUDA cores (torch keeps TF32 off for
        matmuls unless asked); attention in torch's memory-efficient SDPA kernel (the kernel shim
        sends float32 there), which on sm80+ runs float32 on the tensor cores as three TF32
        products (OpMultiplyAddFastF32: pytorch aten/src/ATen/native/transformers/cuda/
        mem_eff_attention/gemm_kernel_utils.h), a third of the TF32 peak. float64: the shim's
        ``torch`` backend, matmuls at the FP64 tensor-core peak."""
        if work not in ("gemm", "attention"):
            raise ValueError(f"work={work!r}; valid: gemm, attention")
        if dtype in ("bfloat16", "float16"):
            return self.peak_tflops
        if dtype == "float32":
            attr = "peak_tf32_tflops" if work == "attention" else "peak_fp32_tflops"
        elif dtype == "float64":
            attr = "peak_fp64_tflops"
        else:
            raise ValueError(f"dtype={dtype!r}; valid: bfloat16, float16, float32, float64")
        v = self._optional(attr, f"{dtype} {work}")
        return v / 3 if attr == "peak_tf32_tflops" else v

    def attn_efficiency(self, t: float, pass_: str = "forward", causal: bool = False) -> float:
        """Fraction of peak (useful FLOPs) of an attention call whose smaller side has ``t``
        tokens. A causal (diagonal) call also computes its diagonal tiles whole: t(t+b)/2
        pairs of work for t(t+1)/2 useful ones, b = ``causal_tile_tokens``; a call within one
        tile (t < b) computes t^2, never more than the same call unmasked."""
        if pass_ not in ("forward", "backward"):
            raise ValueError(f"pass_={pass_!r}; valid: forward, backward")
        eta = self.fwd_eta_max * t / (t + self.t_half_tokens)
        if causal:
            eta *= max((t + 1) / (t + self.causal_tile_tokens), (t + 1) / (2 * t))
        return eta * (self.bwd_over_fwd if pass_ == "backward" else 1.0)

    def attn_seconds(self, flops: float, t: float, pass_: str = "forward",
                     causal: bool = False, dtype: str = "bfloat16") -> float:
        """Time of attention kernel work of ``flops`` in calls of block size ``t`` tokens."""
        if flops <= 0:
            return 0.0
        return flops / (self.peak(dtype, "attention") * 1e12
                        * self.attn_efficiency(t, pass_, causal))

    def gemm_seconds(self, flops: float, dtype: str = "bfloat16") -> float:
        return flops / (self.peak(dtype, "gemm") * 1e12 * self.gemm_efficiency)

    def hbm_seconds(self, nbytes: float) -> float:
        """Time of a memory-bound kernel that moves ``nbytes`` through HBM."""
        return nbytes / (self.hbm_gbps * 1e9 * self.elementwise_efficiency)

    def _optional(self, attr: str, what: str) -> float:
        v = getattr(self, attr)
        if v is None:
            key = next(k for k, a, _ in OPTIONAL_FIELDS if a == attr)
            raise ValueError(f"hardware profile {self.name!r} gives no {key}, which prices "
                             f"{what}; add it as {{value = ..., source = \"...\"}}")
        return v

    def offload_seconds(self, params: float, elem: int) -> float:
        """Optimizer step of ``params`` parameters on the host: their 16-bit gradients down and
        weights up over PCIe, and the host's Adam on them."""
        return (2 * params * elem / (self._optional("pcie_gbps", "optimizer offload") * 1e9)
                + params / self._optional("cpu_adam_params_per_s", "optimizer offload"))

    # -- links ----------------------------------------------------------------------------
    def inter_gbps(self, senders_per_node: int = 1) -> float:
        """Per-GPU bandwidth across nodes while ``senders_per_node`` GPUs of a node send at once.

        One sender gets at most one NIC; many share the node's NICs evenly (DESIGN.md 3: the
        double ring makes all L GPUs cross at once so that every NIC carries traffic)."""
        nics_used = min(self.nics_per_node, max(senders_per_node, 1))
        return self.nic_gbps * self.nic_efficiency * nics_used / max(senders_per_node, 1)

    def link_seconds(self, nbytes: float, link: str, senders_per_node: int = 1) -> float:
        """Time of one transfer of ``nbytes`` on an ``intra`` or ``inter`` link, with latency."""
        if nbytes <= 0:
            return 0.0
        if link == "intra":
            return nbytes / (self.nvlink_gbps * 1e9) + self.nvlink_latency_us * 1e-6
        if link == "inter":
            return nbytes / (self.inter_gbps(senders_per_node) * 1e9) + self.nic_latency_us * 1e-6
        raise ValueError(f"link={link!r}; valid: intra, inter")

    def values_hash(self) -> str:
        """sha256 of the name and every value (not the sources or the description): two
        profiles that price a cell alike hash alike, an edited value changes it."""
        vals = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("description", "sources", "path")}
        return hashlib.sha256(json.dumps(vals, sort_keys=True).encode()).hexdigest()

    def provenance(self) -> dict:
        """What a run records of its profile: its name, file and the hash of its values."""
        return {"name": self.name, "path": self.path, "values_sha256": self.values_hash()}

    @property
    def usable_bytes(self) -> float:
        return self.usable_gib * GIB

    def with_values(self, **values) -> Hardware:
        """A copy with some values replaced (calibration); the sources say 'override'."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = sorted(set(values) - set(kw))
        if unknown:
            raise ValueError(f"unknown hardware fields {unknown}; valid: {sorted(kw)}")
        kw.update(values)
        kw["sources"] = {**self.sources, **{k: "override" for k in values}}
        return Hardware(**kw)


def names() -> list[str]:
    """Profiles shipped in suites/hardware/."""
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def _shown(path: Path) -> str:
    """A profile's file as a user would name it: relative to the checkout when inside it
    (suites/hardware/a800.toml), else absolute."""
    path = path.resolve()
    try:
        return path.relative_to(_DIR.parents[1]).as_posix()
    except ValueError:
        return str(path)


def _shipped() -> str:
    return f"shipped: {', '.join(names())} (or give a path to a .toml profile)"


def profile_path(name_or_path: str | Path) -> Path:
    """The file of a shipped profile's name, or the given path to a profile file."""
    if not isinstance(name_or_path, str | os.PathLike):  # a TypeError from pathlib before
        raise ValueError(f"hardware={name_or_path!r} is not a profile's name or path; "
                         f"{_shipped()}")
    p = Path(name_or_path)
    if p.suffix == ".toml" or len(p.parts) > 1:  # a path, not a name
        if p.is_file():
            return p
        raise ValueError(f"hardware profile file not found: {str(name_or_path)!r}; "
                         f"{_shipped()}")
    q = _DIR / f"{name_or_path}.toml"
    if q.exists():
        return q
    near = difflib.get_close_matches(str(name_or_path), names(), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ValueError(f"unknown hardware profile {str(name_or_path)!r}{hint}; {_shipped()}")


# The range, per unit, that a value read from a profile file must lie in. Far wider than any GPU,
# link or host of 2026 (an H200's 989 TFLOP/s, 4.8 TB/s of HBM, 141 GB), it refuses what a wrong
# unit gives: a NIC's 25 GB/s written as 25e9 bytes/s, a latency of 15 us written as 15e-6 s.
# Only files are checked: in Python, an idealised profile (``Hardware.with_values(peak_tflops=
# 1e12)``, compute for free) is a legitimate way to isolate a term.
_UNITS = {
    "TFLOP/s": ((1e-3, 1e5), ("peak_tflops", "peak_tf32_tflops", "peak_fp32_tflops",
                              "peak_fp64_tflops")),
    "GB/s (1e9 bytes/s) per direction": ((1e-2, 1e5), ("hbm_gbps", "nvlink_gbps", "nic_gbps",
                                                        "pcie_gbps")),
    "microseconds": ((1e-2, 1e6), ("nvlink_latency_us", "nic_latency_us")),
    "GiB": ((1e-2, 1e5), ("memory_gib", "usable_gib")),
    "GPUs or NICs": ((1, 1024), ("gpus_per_node", "nics_per_node")),
    "tokens": ((0, 1e7), ("t_half_tokens", "causal_tile_tokens")),
    "parameters per second": ((1e3, 1e14), ("cpu_adam_params_per_s",)),
}


def _implausible(values: dict[str, float], keys: dict[str, str]) -> list[str]:
    """The values outside their unit's range (``_UNITS``), by their key in the file; a latency
    of exactly 0 (an ideal link) passes."""
    out = []
    for unit, ((lo, hi), attrs) in _UNITS.items():
        for attr in attrs:
            v = values.get(attr)
            # (NaN and inf are the profile's own check: "must be a finite number")
            if v is None or v != v or v == math.inf or (
                    v == 0 and unit == "microseconds") or lo <= v <= hi:
                continue
            out.append(f"{keys[attr]}={v:g} is outside {lo:g}-{hi:g} {unit}" + (
                "" if unit == "GPUs or NICs" else ": is it in another unit?"))
    return out


# The fastest link of each kind in 2026, per direction in GB/s. Links are sold in bits (a
# "400G" NIC is 400 Gb/s = 50 GB/s) or both ways at once (NVLink's 1.8 TB/s is 900 GB/s each
# way), and the keys' ``gbps`` reads as gigabits: a value above these, which such a slip gives
# (8x, 2x), is warned about, not refused (a faster link may come).
_FASTEST = {
    "nic_gbps": (100.0, "an 800 Gb/s XDR InfiniBand or 800GbE NIC: 100 GB/s", 8),
    "nvlink_gbps": (900.0, "NVLink 5: 1.8 TB/s both ways, 900 GB/s per direction", 2),
    "pcie_gbps": (128.0, "PCIe 6.0 x16: 128 GB/s per direction", 8),
}


def _too_fast(values: dict[str, float], keys: dict[str, str]) -> list[str]:
    """The bandwidths above the fastest link of their kind (``_FASTEST``), with the likely
    slip."""
    out = []
    for attr, (fastest, what, slip) in _FASTEST.items():
        v = values.get(attr)
        if v is not None and v > fastest:
            why = ("a line rate in Gb/s is 8x its GB/s" if slip == 8 else
                   "a bidirectional figure is 2x the per-direction one")
            out.append(f"{keys[attr]}={v:g} is in GB/s (1e9 bytes/s) per direction, above the "
                       f"fastest of 2026 ({what}); {why}: divide by {slip} if so")
    return out


# what a profile file may hold besides its FIELDS and OPTIONAL_FIELDS
_TOP_KEYS = ("name", "description")
_ENTRY_KEYS = ("value", "source")


def _key_problems(raw: dict) -> list[str]:
    """Unknown (misspelt) sections, keys and entry keys, with the spec parser's "did you mean"
    (``suites.spec._Reader.keys``): a misspelt optional key would silently be absent."""
    from suites.spec import _Reader

    layout: dict[str, set[str]] = {}
    for key, _, _ in (*FIELDS, *OPTIONAL_FIELDS):
        section, _, leaf = key.partition(".")
        layout.setdefault(section, set()).add(leaf)
    r = _Reader()
    r.keys(raw, set(_TOP_KEYS) | set(layout), "")
    for section, leaves in layout.items():
        table = raw.get(section)
        if not isinstance(table, dict):
            continue
        r.keys(table, leaves, f"{section}.")
        for leaf, entry in table.items():
            if leaf in leaves and isinstance(entry, dict):
                r.keys(entry, set(_ENTRY_KEYS), f"{section}.{leaf}.")
    return r.problems


def load(name_or_path: str | Path) -> Hardware:
    """Read a profile, check every required value (and each optional one it gives) is present
    with a source, that it has no unknown key, and that each value lies in its unit's (wide)
    range, which a value given in another unit leaves (``_UNITS``). A bandwidth above the
    fastest link of its kind is warned about (``_FASTEST``: a NIC's Gb/s given as GB/s).

    A profile read from a path must not carry a shipped profile's name unless it is that file:
    its rows would be written, and tabulated, as the shipped profile's (``simulated-<name>``)."""
    path = profile_path(name_or_path)
    try:
        # utf-8-sig: a byte-order mark (Windows editors) was "Invalid statement at line 1"
        raw = tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:  # which file, as a spec's says
        raise ValueError(f"hardware profile {path}: not valid TOML: {e}") from None
    kw, sources = {}, {}
    problems = _key_problems(raw)
    optional = {key for key, _, _ in OPTIONAL_FIELDS}
    for key, attr, typ in (*FIELDS, *OPTIONAL_FIELDS):
        section, _, leaf = key.partition(".")
        table = raw.get(section, {})
        if not isinstance(table, dict):
            bad = f"{section} must be a table ([{section}]), not {table!r}"
            if bad not in problems:
                problems.append(bad)
            continue
        entry = table.get(leaf)
        if entry is None:
            if key not in optional:
                problems.append(f"{key} is missing; give it as {{value = ..., source = "
                                "\"...\"}")
            continue
        if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
            problems.append(f"{key} must be a table {{value = ..., source = \"...\"}}")
            continue
        if not isinstance(entry["source"], str) or not entry["source"].strip():
            problems.append(f"{key}: source={entry['source']!r} must say where the value comes "
                            "from (datasheet, design, measured, assumed or calibrated: how)")
            continue
        v = entry["value"]
        if isinstance(v, bool) or typ is int and not isinstance(v, int) or not isinstance(
                v, int | float):
            problems.append(f"{key}={v!r} must be {typ.__name__}")
            continue
        kw[attr] = typ(v)
        sources[key] = str(entry["source"])
    from suites.spec import is_folder_name

    name = raw.get("name", path.stem)
    shipped = {n.lower(): n for n in names()}  # "A800" is a800's folder on macOS
    if not isinstance(name, str) or not is_folder_name(name):
        problems.append(f"name={name!r} must be letters, digits and _ . - (not first . or -): "
                        "it names the run folder simulated-<name>")
    elif name.lower() in shipped and path.resolve() != (
            _DIR / f"{shipped[name.lower()]}.toml").resolve():
        name = shipped[name.lower()]
        problems.append(
            f"name={name!r} is the shipped profile suites/hardware/{name}.toml, but this is "
            f"another file: give it its own name (name = \"my-{name}\", say), or its rows "
            f"would be written and tabulated as the shipped {name}'s (simulated-{name})")
    keys = {attr: key for key, attr, _ in (*FIELDS, *OPTIONAL_FIELDS)}
    problems += _implausible(kw, keys)
    if problems:
        raise ValueError(f"hardware profile {path}: " + "; ".join(problems))
    for note in _too_fast(kw, keys):
        warnings.warn(f"hardware profile {path}: {note}", stacklevel=2)
    try:
        return Hardware(name=name, description=raw.get("description", ""),
                        sources=sources, path=_shown(path), **kw)
    except ValueError as e:  # its values' problems, with the file they are in
        raise ValueError(f"{path}: {e}") from None
