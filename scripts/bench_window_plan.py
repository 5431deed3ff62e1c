#!/usr/bin/env python3
"""Windowed and document attention: tiled block plans against one dense mask per block.

    python scripts/bench_window_plan.py              # 4 ranks x 4096 tokens, window 512 and docs

``burst.masks.plan_pair`` splits a partly visible block until every piece is mask-free or at most
``TILE`` x ``TILE`` (documents are cut at their starts). Untiled (``TILE`` and ``DOC_CUT_MIN``
set to the block length), a partly visible block is one DENSE call with a mask over the block,
cropped only to the rows and keys that see anything, computing every pair inside, masked or not
(before the tiling, not even cropped). Both plans run here in one process on the same inputs:
the whole emulated ring (every rank's steps, ``burst.emulate``), forward + backward, rounds
interleaved, medians compared. Then the plans of a paper-scale whole-sequence attention
(Ulysses, 1M tokens) are counted, not run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from _args import positive_int  # noqa: E402  (scripts/, the folder a script runs from)

import burst.masks as M  # noqa: E402
from burst.emulate import emulate_attn  # noqa: E402
from burst.timing import time_call  # noqa: E402


def _masks(total: int) -> dict:
    """A window, and documents with random boundaries (on average ``total`` / 4 and / 40)."""
    out = {"window 512": dict(causal=True, window=(512, 0))}
    for docs in (4, 40):
        cuts = torch.randint(1, total, (docs - 1,), generator=torch.Generator().manual_seed(0))
        out[f"{docs} docs"] = dict(causal=True, cu_seqlens=(0, *sorted(set(cuts.tolist())), total))
    return out


def _ring(q, k, v, do, world, layout, mask):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    emulate_attn(*leaves, world=world, layout=layout, **mask).backward(do)


def _largest_mask(spec, world, layout, n) -> int:
    return max((c.mask.numel() for r in range(world) for s in range(world)
                for c in M.plan_pair(spec, layout, world, r, s, n) if c.kind == M.DENSE),
               default=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=positive_int, default=4)
    ap.add_argument("--seq-local", type=positive_int, default=4096)
    ap.add_argument("--heads", type=positive_int, default=4)
    ap.add_argument("--head-dim", type=positive_int, default=64)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--big", type=positive_int, default=1 << 20,
                    help="tokens of the planned-only case (>= 2)")
    args = ap.parse_args(argv)
    if args.seq_local % 2:
        ap.error(f"--seq-local {args.seq_local} is odd; the zigzag layout cuts each rank's tokens "
                 "into 2 chunks: give an even number")
    if args.big < 2:
        ap.error(f"--big {args.big} is too short: its documents are cut at random positions in "
                 "1..big-1; give at least 2")
    torch.set_num_threads(1)
    g, n = args.world, args.seq_local
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, g * n, args.heads, args.head_dim, generator=gen)
                   for _ in range(4))
    tile, doc_cut = M.TILE, M.DOC_CUT_MIN
    print(f"whole emulated ring, forward + backward, {g} ranks x {n} tokens, {args.heads} heads x "
          f"{args.head_dim}, float32, 1 thread, median of {args.repeats} (TILE = {tile}, "
          f"DOC_CUT_MIN = {doc_cut})")
    print(f"{'mask':>11}{'layout':>12}{'tiled s':>9}{'one mask s':>12}{'ratio':>7}"
          f"{'largest mask KiB tiled / one':>30}")
    for name, mask in _masks(g * n).items():
        spec = M.MaskSpec(**mask)
        for layout in ("contiguous", "zigzag"):
            times: dict = {(tile, doc_cut): [], (n, n): []}
            run = partial(_ring, q, k, v, do, g, layout, mask)
            for _ in range(args.repeats + 1):  # the first round warms the caches up
                for t in times:
                    M.TILE, M.DOC_CUT_MIN = t
                    times[t].append(time_call(run, "cpu"))
            sizes = []
            for t in times:
                M.TILE, M.DOC_CUT_MIN = t
                sizes.append(_largest_mask(spec, g, layout, n) / 2**10)
            M.TILE, M.DOC_CUT_MIN = tile, doc_cut
            a, b = (statistics.median(times[t][1:]) for t in times)
            print(f"{name:>11}{layout:>12}{a:>9.2f}{b:>12.2f}{b / a:>7.2f}"
                  f"{sizes[0]:>18.0f} / {sizes[1]:.0f}", flush=True)
    big = args.big
    print(f"\nwhole-sequence attention of one rank (Ulysses), {big} tokens: plan, not run")
    cuts = torch.randint(1, big, (big // 1000,), generator=torch.Generator().manual_seed(0))
    cu = (0, *sorted(set(cuts.tolist())), big)  # documents of ~1000 tokens on average
    for name, spec in (("window 4096", M.MaskSpec(causal=True, window=(4096, 0))),
                       (f"{len(cu) - 1} random documents", M.MaskSpec(causal=True,
                                                                      cu_seqlens=cu))):
        t0 = time.perf_counter()
        calls = M.plan_pair(spec, "contiguous", 1, 0, 0, big)
        took = time.perf_counter() - t0
        kinds = dict(Counter(c.kind for c in calls))
        largest = max((c.mask.numel() for c in calls if c.kind == M.DENSE), default=0)
        print(f"  {name}: {len(calls)} calls {kinds}, planned in {took:.2f} s; largest mask "
              f"{largest / 2**10:.0f} KiB (one mask: {big * big / 2**30:.0f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
