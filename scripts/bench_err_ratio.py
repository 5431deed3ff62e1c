#!/usr/bin/env python3
"""What a 16-bit cell's ``max_err_ratio`` reads for rounding and for a wrong result, on G gloo
ranks.

    .venv/bin/python scripts/bench_err_ratio.py [--worlds 2 4 8 16 32] [--seq-len 1024]

The column (``suites.measure``; ``results/schema.py``) is each tensor's max error against the
float64 reference over a plain bfloat16 attention's on the same inputs, the largest of out, dq,
dk, dv. This runs the harness's own measurement (``suites.measure.measure``, causal, bfloat16,
head dim 16) of burst, ulysses and zigzag_ring with its travelling dK/dV in bfloat16
(``grad_acc="input"``), and of the test suite's method whose output is 5% off
(``tests/harness_methods.py``: finite, and within bfloat16's absolute limit, so only the ratio
tells it), with G and 2G heads at each G (Ulysses needs G to divide the heads). The README's
reading of the column (what rounding reads, what an output 5% off reads) rests on this output,
kept in ``results/err_ratio.txt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (scripts/, the folder a script runs from)

from burst.spawn import spawn  # noqa: E402

# (label, method, options): zigzag_ring with grad_acc="input" keeps its travelling dK/dV in
# bfloat16, the roughest rounding this project offers
METHODS = (("burst", "burst", {}), ("ulysses", "ulysses", {}),
           ("zigzag_ring bf16 dK/dV", "zigzag_ring", {"grad_acc": "input"}),
           ("5% off", "tests.harness_methods:off_by_five_percent", {}))


def _ratios(rank: int, world: int, heads: int, seq_len: int) -> dict[str, float]:
    from suites import measure
    from suites.simulate import as_cell

    out = {}
    for label, name, options in METHODS:
        row = measure.measure(as_cell(dict(
            method=name, options=options, seq_len=seq_len, world=world, heads=heads,
            head_dim=16, device="cpu", dtype="bfloat16", warmup=0, repeats=1,
            profile_memory=False, compute_error=True)))
        if row["status"] != "ok":
            raise RuntimeError(f"{label} at G={world}, {heads} heads: {row['status']}: "
                               f"{row.get('error')}")
        out[label] = row["max_err_ratio"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=positive_int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--seq-len", type=positive_int, default=1024)
    a = p.parse_args(argv)
    if bad := [g for g in a.worlds if a.seq_len % (2 * g)]:
        p.error(f"--seq-len {a.seq_len} must split into 2 zigzag chunks a rank at G={bad[0]}")
    print(f"max_err_ratio of bfloat16 cells (causal, {a.seq_len} tokens, head dim 16)")
    print(f"{'G':>3} {'heads':>5} " + " ".join(f"{m[0]:>22}" for m in METHODS))
    for world in a.worlds:
        for heads in (world, 2 * world):
            got = spawn(_ratios, world, args=(heads, a.seq_len), timeout_s=600)[0]
            print(f"{world:>3} {heads:>5} " + " ".join(f"{got[m[0]]:>22.2f}" for m in METHODS),
                  flush=True)


if __name__ == "__main__":
    main()
