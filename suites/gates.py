"""Deterministic performance gates: numbers that cannot be noisy, checked against stored values.

A performance regression often shows first in quantities that need no clock: a method starts to
move more bytes, a checkpointing mode keeps more activations, a FLOP count or a simulator
prediction changes. These are exact on any machine, so they are gated exactly (issue 7):

- ``bytes.*``      bytes sent per rank by (phase, link), measured by ``burst.comm.count_bytes``
                   on 4 gloo ranks (2 "nodes" of 2) for every CPU-capable registry method;
- ``kept.*``       bytes kept between forward and backward (saved tensors without parameters,
                   plus the attention cache) per checkpointing mode, tiny model, 4 ranks;
- ``flops.*``      ``burst.flops`` for the paper's models and sequence lengths;
- ``sim.*``        the simulator's predictions for the paper configurations (status,
                   tokens/s per GPU, TFLOP/s, memory).

The stored values live in ``suites/gates_expected.json``. A change that moves them must update
the file on purpose, and the diff says by how much:

    python -m suites.gates            # compare, print the differences, exit 1 on any
    python -m suites.gates --update   # rewrite the expected file, print what changed

``tests/test_gates.py`` runs the comparison in CI.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

__all__ = ["EXPECTED", "collect", "compare", "format_diff"]

EXPECTED = Path(__file__).with_name("gates_expected.json")

# (registry name, options) measured for bytes; every CPU-capable core method appears
BYTE_CASES = [
    ("burst", {"layout": "zigzag", "backward": "burst"}),
    ("burst", {"layout": "zigzag", "backward": "ring"}),
    ("burst", {"layout": "zigzag", "backward": "burst", "ranks_per_node": 2}),
    ("ring", {}),
    ("zigzag_ring", {}),
    ("striped_ring", {}),
    ("allgather", {}),
    ("ulysses", {}),
    ("usp", {"ulysses_degree": 2}),
    ("usp", {"ulysses_degree": 2, "layout": "zigzag", "backward": "burst"}),
    ("double_ring", {"ranks_per_node": 2}),
]
BYTE_SHAPES = [dict(batch=1, seq_local=16, heads=4, kv_heads=4, head_dim=16),
               dict(batch=1, seq_local=16, heads=4, kv_heads=2, head_dim=16)]
GATE_WORLD, GATE_NODE = 4, 2
FLOP_MODELS = ("7b", "14b", "llama3-8b")
FLOP_SEQS = (32768, 131072, 1048576, 4194304)
SIM_SPECS = ("paper_kernel_32gpu", "paper_main_7b", "paper_main_14b", "paper_ablation",
             "paper_weak_scaling")


def _key(*parts) -> str:
    return ".".join(str(p) for p in parts)


def _opts_label(opts: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(opts.items())) or "default"


def _measure_rank(rank: int, world: int) -> dict:
    """On every rank: bytes per method case, and kept bytes per checkpointing mode."""
    from baselines import registry
    from burst import comm
    from burst.layout import shard

    out = {}
    for name, opts in BYTE_CASES:
        method = registry.get(name)
        if method.unavailable():
            continue
        for shape in BYTE_SHAPES:
            g = torch.Generator().manual_seed(0)
            n = shape["seq_local"] * world
            full = [torch.randn(shape["batch"], n, h, shape["head_dim"], generator=g)
                    for h in (shape["heads"], shape["kv_heads"], shape["kv_heads"])]
            loc = [shard(t, layout=method.layout(opts)).requires_grad_() for t in full]
            with comm.count_bytes(ranks_per_node=GATE_NODE) as c:
                method(*loc, causal=True, **opts).sum().backward()
            tag = f"H{shape['heads']}kv{shape['kv_heads']}"
            for (phase, link), v in sorted(c._sent.items()):
                out[_key("bytes", name, _opts_label(opts), tag, phase, link)] = v
    out.update(_kept_bytes())
    return out


def _kept_bytes() -> dict:
    from burst import flops
    from burst.engine import Trainer, get_config
    from burst.memory import SavedBytes, parameter_storages

    out = {}
    for mode in flops.CHECKPOINTING:
        for fused in (True, False):
            tr = Trainer(get_config("tiny"), attention_options={"layout": "striped"},
                         checkpointing=mode, fused_head=fused, seed=0)
            tokens, targets, positions = tr.local_batch(64, batch=1, seed=0)
            with SavedBytes(exclude=parameter_storages(tr.model)) as s:
                loss = tr.model(tokens, positions, targets, loss_scale=1.0)
            cache = tr.model.cache.nbytes
            loss.backward()
            head = "fused" if fused else "plain"
            out[_key("kept", mode, head, "saved")] = s.bytes
            out[_key("kept", mode, head, "cache")] = cache
    return out


def _flops() -> dict:
    from burst import flops
    from burst.engine import get_config

    out = {}
    for name in FLOP_MODELS:
        cfg = get_config(name)
        for seq in FLOP_SEQS:
            for conv in flops.CONVENTIONS:
                mode = "selective" if conv == "hardware_flops" else "none"
                out[_key("flops", name, seq, conv)] = flops.model_flops(
                    cfg, 1, seq, conv, checkpointing=mode)
            for mode in flops.CHECKPOINTING:
                out[_key("flops", name, seq, "recompute", mode)] = flops.recompute_flops(
                    cfg, 1, seq, mode)
    return out


def _simulated() -> dict:
    from suites.simulate import simulate_spec

    out = {}
    for spec in SIM_SPECS:
        for r in simulate_spec(spec, "a800"):
            base = _key("sim", spec, r["label"] or r["method"], r["world"], r["seq_len"],
                        r.get("checkpointing") or "-")
            if _key(base, "status") in out:  # two cells of a spec must not share a gate
                raise ValueError(f"gate {base} names two cells of {spec}")
            out[_key(base, "status")] = r["status"]
            for col in ("tokens_per_s", "attn_tflops", "mem_reserved_bytes"):
                if r.get(col) is not None:
                    out[_key(base, col)] = float(r[col])
    return out


def collect(world: int = GATE_WORLD) -> dict:
    """Every gate value, freshly computed (one 4-rank spawn + arithmetic + the simulator)."""
    from burst.spawn import spawn

    per_rank = spawn(_measure_rank, world, timeout_s=600)
    values = {}
    for rank, vals in enumerate(per_rank):
        for k, v in vals.items():
            if k.startswith("bytes.") or rank == 0:
                values[k if not k.startswith("bytes.") else _key(k, f"rank{rank}")] = v
    values.update(_flops())
    values.update(_simulated())
    return dict(sorted(values.items()))


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return a == b


def compare(expected: dict, got: dict) -> list[tuple[str, object, object]]:
    """(key, expected, got) for every value that differs, appeared or vanished."""
    keys = sorted(set(expected) | set(got))
    return [(k, expected.get(k), got.get(k)) for k in keys
            if k not in expected or k not in got or not _same(expected[k], got[k])]


def format_diff(diff: list[tuple[str, object, object]]) -> str:
    """One line per differing gate; values in full (repr), the change to three significant
    digits (a move far below 0.01% still shows)."""
    wide = max([24, *(len(repr(v)) + 2 for _, a, b in diff for v in (a, b))])
    lines = [f"{'gate':<90}{'expected':>{wide}}{'got':>{wide}}{'change':>12}"]
    for k, a, b in diff:
        change = ""
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
            change = f"{100 * (b - a) / abs(a):+.3g}%"
        lines.append(f"{k:<90}{a!r:>{wide}}{b!r:>{wide}}{change:>12}")
    return "\n".join(lines)


def load_expected(path: Path = EXPECTED) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suites.gates", description=__doc__.split("\n")[0])
    p.add_argument("--update", action="store_true", help="rewrite the expected values")
    p.add_argument("--expected", type=Path, default=EXPECTED)
    args = p.parse_args(argv)
    if not args.update and not args.expected.is_file():
        p.error(f"--expected {args.expected}: no such file (--update writes it)")
    got = collect()
    expected = load_expected(args.expected)
    diff = compare(expected, got)
    if diff:
        print(format_diff(diff))
    if args.update:
        args.expected.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} gate values to {args.expected} ({len(diff)} changed)")
        return 0
    print(f"{len(got)} gate values, {len(diff)} differ from {args.expected}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
