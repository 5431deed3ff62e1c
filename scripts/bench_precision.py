#!/usr/bin/env python3
"""Low-precision error of the whole BurstAttention ring against a plain same-dtype attention.

    python scripts/bench_precision.py    # bf16, fp16 x MHA, GQA x G = 2-16 x 20 seeds, then
                                         # float32 at logits of std 1-1e4, G = 1-64 (~1.5 min)

A ring computes each (query block, key block) pair with a kernel that returns its partial output
and gradients in the input dtype, as flash-attention kernels do, and merges them in fp32; a
plain implementation (``burst.reference.naive_attention``) rounds once per tensor. Both are
compared with the float64 oracle on the same rounded inputs; the table gives the worst ratio of
our error to the plain one over seeds x layouts x backward schemes, once as the max error over
the tensor (flash-attention's kernel rule asks for at most 2x) and once as the RMS error.
Emulated ranks in one process (``burst.emulate``), causal, 16 tokens per rank, head dim 16, in
two head shapes: MHA (4 query heads, 4 kv heads) and GQA (8 query heads sharing 1 kv head, where
every block's dK/dV already sums 8 heads before it is rounded, so the ring's extra roundings
weigh more than in MHA).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from _args import positive_int  # noqa: E402  (scripts/, the folder a script runs from)

from burst.emulate import emulate_attn  # noqa: E402
from burst.layout import LAYOUTS  # noqa: E402
from burst.reference import naive_attention, reference_attention  # noqa: E402

NAMES = ("out", "dq", "dk", "dv")


def _grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(do)
    return [out.detach(), *(t.grad for t in leaves)]


SHAPES = {"MHA": (4, 4), "GQA": (8, 1)}  # (query heads, kv heads)


def ratios(dtype: torch.dtype, world: int, seed: int, seq_local: int = 16,
           heads: tuple[int, int] = SHAPES["MHA"]) -> list[dict]:
    """Our error over the plain one (max and RMS), per layout x scheme x tensor."""
    g = torch.Generator().manual_seed(seed)
    h, hk = heads
    q, k, v, do = (torch.randn(1, seq_local * world, n, 16, generator=g, dtype=torch.float64)
                   for n in (h, hk, hk, h))
    ref = _grads(lambda a, b, c: reference_attention(a, b, c, causal=True), q, k, v, do)
    low = [t.to(dtype) for t in (q, k, v, do)]
    plain = _grads(lambda a, b, c: naive_attention(a, b, c, causal=True), *low)
    rows = []
    for layout in LAYOUTS:
        for scheme in ("burst", "ring"):
            ours = _grads(lambda a, b, c, lay=layout, s=scheme: emulate_attn(
                a, b, c, world=world, causal=True, layout=lay, backward=s), *low)
            for name, o, p, r in zip(NAMES, ours, plain, ref, strict=True):
                eo, ep = o.double() - r, p.double() - r
                rows.append(dict(layout=layout, scheme=scheme, tensor=name,
                                 max=float(eo.abs().max() / ep.abs().max()),
                                 rms=float(eo.pow(2).mean().sqrt() / ep.pow(2).mean().sqrt())))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=positive_int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--seeds", type=positive_int, default=20)
    ap.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("worst ratio of our error to a plain same-dtype attention's (float64 oracle), over "
          f"{args.seeds} seeds x {len(LAYOUTS)} layouts x 2 backward schemes, causal")
    print(f"{'heads':5} {'dtype':9} {'G':>3}  " + "  ".join(f"{n + ' max':>7} {n + ' rms':>7}"
                                                         for n in NAMES))
    worst = {shape: {"max": 0.0, "rms": 0.0} for shape in args.shapes}
    for shape in args.shapes:
        for dtype in (torch.bfloat16, torch.float16):
            for world in args.worlds:
                rows = [r for s in range(args.seeds)
                        for r in ratios(dtype, world, s, heads=SHAPES[shape])]
                cells = []
                for name in NAMES:
                    mine = [r for r in rows if r["tensor"] == name]
                    hi = {m: max(r[m] for r in mine) for m in ("max", "rms")}
                    worst[shape] = {m: max(worst[shape][m], hi[m]) for m in hi}
                    cells.append(f"{hi['max']:7.2f} {hi['rms']:7.2f}")
                print(f"{shape:5} {str(dtype).removeprefix('torch.'):9} {world:3d}  "
                      + "  ".join(cells), flush=True)
    for shape, w in worst.items():
        h, hk = SHAPES[shape]
        print(f"worst {shape} ({h} query heads, {hk} kv heads): max error {w['max']:.2f}x, "
              f"RMS error {w['rms']:.2f}x the plain one's")
    print("\nfloat32 at large logits (logit std L; MHA, 128 tokens, zigzag, burst backward, "
          "seed 0): max abs error against the float64 oracle over the oracle's max abs value, "
          "ours on G emulated ranks (G = 1: one kernel call) / a plain float32 attention's")
    print(f"{'L':>7} {'G':>3}  " + "  ".join(f"{n + ' ours':>9} {n + ' plain':>9}" for n in NAMES))
    for logit in (1.0, 1e2, 1e3, 1e4):
        for world in (1, 2, 16, 64):
            ours, plain = large_logit_errors(logit, world)
            print(f"{logit:7.0e} {world:3d}  " + "  ".join(
                f"{a:9.1e} {b:9.1e}" for a, b in zip(ours, plain, strict=True)), flush=True)
    return 0


def large_logit_errors(logit: float, world: int, tokens: int = 128) -> tuple[list, list]:
    """Max abs errors over the oracle's max abs value (out, dq, dk, dv) of the emulated ring
    and of a plain attention, both in float32, at logits of standard deviation ``logit``: each
    block's fp32 lse is rounded to its ulp (eps x |lse|) and the merge carries that into every
    block's weight, where one kernel call normalises by the row's max; a flash-style backward,
    on one rank too, recomputes P from the fp32 lse."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, tokens, 4, 16, generator=g, dtype=torch.float64)
                   for _ in range(4))
    q = q * (logit ** 0.5 * 16 ** 0.25)  # q.k / sqrt(16) has std logit
    k = k * (logit ** 0.5 * 16 ** 0.25)
    ref = _grads(lambda a, b, c: reference_attention(a, b, c, causal=True), q, k, v, do)
    low = [t.float() for t in (q, k, v, do)]
    ours = _grads(lambda a, b, c: emulate_attn(a, b, c, world=world, causal=True,
                                               layout="zigzag", backward="burst"), *low)
    plain = _grads(lambda a, b, c: naive_attention(a, b, c, causal=True), *low)
    return ([float((o.double() - r).abs().max() / r.abs().max())
             for o, r in zip(ours, ref, strict=True)],
            [float((p.double() - r).abs().max() / r.abs().max())
             for p, r in zip(plain, ref, strict=True)])


if __name__ == "__main__":
    sys.exit(main())
