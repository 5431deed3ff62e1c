"""Time gates that hold on noisy machines: ratios measured in one run, against a stored baseline.

Absolute times do not transfer between machines, and on a shared machine they drift by tens of
percent within minutes. A *ratio* of two things measured alternately in the same run (method A
against method B, or our code against one plain kernel call) cancels most of that drift. Each
gate here is such a ratio: the median over ``repeats`` interleaved pairs. Its threshold comes from
the measured run-to-run spread of the ratio on the same machine class (``--record`` runs every
gate ``trials`` times), never from a guess:

    threshold = baseline median * (1 + max(3 * spread, 5 %))
    spread    = (max - min) / median over the recorded trials

    python -m suites.timegate --record   # measure baseline + spread for this machine class
    python -m suites.timegate            # check: exit 1 when a ratio exceeds its threshold

Baselines live in ``benchmarks/time_gates.json`` keyed by machine class (``machine_class``: the
CPU architecture, thread count and model name, after the GPU model on a GPU machine).
The gates are deliberately not part of ``make test`` (a timed test flakes on a shared 2-core
machine); ``make perf-gate`` runs them on a quiet machine of the recorded class (they time CPU
code, also on a GPU runner).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from suites.measure import cpu_model

__all__ = ["GATES", "machine_class", "measure_ratio", "record", "check"]

STORE = Path(__file__).resolve().parent.parent / "benchmarks" / "time_gates.json"


def machine_class() -> str:
    """The CPU's architecture, thread count and model name, after the GPU model on a GPU
    machine (the gates time CPU code there too): one ratio read 1.35 on one x86-64 CPU and
    1.20-1.28 on another (docs/regressions.md). A CPU's name is what /proc/cpuinfo says, which
    in a VM can be as generic as "AMD EPYC": one class for several CPU generations."""
    model = re.sub(r"[^A-Za-z0-9.]+", "_", cpu_model()).strip("_")
    cpu = f"cpu-{platform.machine()}-{torch.get_num_threads()}t" + (f"-{model}" if model else "")
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0).replace(" ", "_") + "-" + cpu
    return cpu


def measure_ratio(a: Callable[[], object], b: Callable[[], object], *, repeats: int = 7,
                  warmup: int = 1) -> float:
    """Median of time(a)/time(b) over interleaved pairs (load hits both alike)."""
    for _ in range(warmup):
        a()
        b()
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


def _fused_head_gate() -> tuple[Callable, Callable]:
    """Fused LM head + loss against the plain head + cross-entropy (issue 4 bound: 1.2x)."""
    from burst.engine.fused_loss import fused_linear_cross_entropy, plain_cross_entropy

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2048, 64, generator=g)
    weight = torch.randn(8000, 64, generator=g) * 0.05
    targets = torch.randint(0, 8000, (2048,), generator=g)

    def run(fn, **kw):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        fn(h, w, targets, **kw).backward()

    return (lambda: run(fused_linear_cross_entropy, chunk=512),
            lambda: run(plain_cross_entropy))


def _burst_vs_ring_backward_gate() -> tuple[Callable, Callable]:
    """Per-rank compute of the emulated burst backward against the ring backward (same work)."""
    from burst.emulate import RingEmulator

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2048, 4, 64, generator=g) for _ in range(4))
    em = RingEmulator(q, k, v, world=4, causal=True, layout="zigzag")
    em.forward()
    return (lambda: em.backward(do, scheme="burst"), lambda: em.backward(do, scheme="ring"))


def _ring_forward_vs_kernel_gate() -> tuple[Callable, Callable]:
    """Emulated 4-rank zigzag forward (all blocks, merges) against one causal kernel call on the
    whole sequence: the ring's overhead over the ideal, all ranks' compute together."""
    from burst.emulate import RingEmulator
    from burst.kernel import block_forward
    from burst.masks import CAUSAL

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2048, 4, 64, generator=g) for _ in range(3))
    em = RingEmulator(q, k, v, world=4, causal=True, layout="zigzag")
    return em.forward, lambda: block_forward(q, k, v, kind=CAUSAL)


def _kernel_vs_torch_sdpa_gate() -> tuple[Callable, Callable]:
    """The kernel shim's causal forward + backward (``burst.kernel``, the one path every method's
    local attention takes) against torch's own SDPA on the same tensors: the shim's overhead.
    The ring gates above cannot see a slower kernel (both of their sides call it)."""
    import torch.nn.functional as F

    from burst.kernel import block_backward, block_forward
    from burst.masks import CAUSAL
    from burst.merge import row_delta

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2048, 4, 64, generator=g) for _ in range(4))

    def ours():
        out, lse = block_forward(q, k, v, kind=CAUSAL)
        delta = row_delta(do, out, torch.float32)
        block_backward(do, q, k, v, lse, delta, kind=CAUSAL)

    def theirs():
        qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(do.transpose(1, 2))

    return ours, theirs


GATES: dict[str, Callable[[], tuple[Callable, Callable]]] = {
    "kernel_over_torch_sdpa": _kernel_vs_torch_sdpa_gate,
    "fused_head_over_plain": _fused_head_gate,
    "burst_bwd_over_ring_bwd": _burst_vs_ring_backward_gate,
    "ring_fwd_over_one_kernel": _ring_forward_vs_kernel_gate,
}


def _load() -> dict:
    return json.loads(STORE.read_text()) if STORE.exists() else {}


def record(trials: int = 5, repeats: int = 7) -> dict:
    """Measure every gate ``trials`` times; store median, spread and threshold."""
    torch.set_num_threads(1)
    out = {}
    for name, make in GATES.items():
        a, b = make()
        vals = [measure_ratio(a, b, repeats=repeats) for _ in range(trials)]
        med = statistics.median(vals)
        spread = (max(vals) - min(vals)) / med
        out[name] = {"baseline": med, "spread": spread, "trials": vals,
                     "threshold": med * (1 + max(3 * spread, 0.05))}
        print(f"{name:<28} median {med:.3f}  spread {spread:.1%}  "
              f"threshold {out[name]['threshold']:.3f}  trials {[round(x, 3) for x in vals]}")
    store = _load()
    store[machine_class()] = out
    STORE.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    return out


def check(repeats: int = 7) -> int:
    torch.set_num_threads(1)
    base = _load().get(machine_class())
    if base is None:
        print(f"no recorded baseline for machine class {machine_class()!r} in {STORE} "
              f"(recorded: {', '.join(sorted(_load())) or 'none'}); run `python -m "
              "suites.timegate --record` on a quiet machine of this class first")
        return 2
    missing = [name for name in GATES if name not in base]
    if missing:
        print(f"no recorded baseline for gate(s) {', '.join(missing)} on machine class "
              f"{machine_class()!r} in {STORE}; run `python -m suites.timegate --record`")
        return 2
    failed = 0
    for name, make in GATES.items():
        a, b = make()
        r = measure_ratio(a, b, repeats=repeats)
        limit = base[name]["threshold"]
        ok = r <= limit
        failed += not ok
        print(f"{name:<28} ratio {r:.3f}  baseline {base[name]['baseline']:.3f}  "
              f"threshold {limit:.3f}  {'ok' if ok else 'REGRESSED'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suites.timegate",
                                description=__doc__.split("\n")[0])
    p.add_argument("--record", action="store_true",
                   help="measure each gate's baseline and spread on this machine class and store "
                        "them in benchmarks/time_gates.json (default: check against them)")
    p.add_argument("--trials", type=int, default=5,
                   help="with --record: runs of every gate the spread is taken over "
                        "(default: %(default)s)")
    p.add_argument("--repeats", type=int, default=7,
                   help="interleaved pairs a ratio is the median of (default: %(default)s)")
    args = p.parse_args(argv)
    for name in ("trials", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: give a whole number >= 1")
    if args.record:
        record(args.trials, args.repeats)
        return 0
    return check(args.repeats)


if __name__ == "__main__":
    sys.exit(main())
