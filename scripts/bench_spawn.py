"""Seconds ``burst.spawn.spawn`` takes to start G gloo ranks, join them in a process group and
collect their results, for each start method (``BURST_START_METHOD``).

    .venv/bin/python scripts/bench_spawn.py [--worlds 1 2 4 8] [--repeats 3]

"spawn" starts each rank as a new interpreter that imports torch; "forkserver" (the default)
forks each rank from a server that imported torch once, at the first spawn of the process (its
start is the "first" column; the other columns are medians of the repeats that follow it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from burst.spawn import spawn


def _nothing(rank: int, world: int) -> int:
    return rank


def seconds(world: int) -> float:
    start = time.perf_counter()
    assert spawn(_nothing, world) == list(range(world))
    return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    if min(a.worlds) < 1 or a.repeats < 1:
        p.error("--worlds and --repeats: each must be at least 1")
    print(f"{os.cpu_count()} cores; seconds per spawn (median of {a.repeats})")
    print(f"{'method':>10} {'first':>6} " + " ".join(f"{f'G={g}':>6}" for g in a.worlds))
    for method in ("spawn", "forkserver"):
        os.environ["BURST_START_METHOD"] = method
        first = seconds(1)
        row = [statistics.median(seconds(g) for _ in range(a.repeats)) for g in a.worlds]
        print(f"{method:>10} {first:>6.2f} " + " ".join(f"{s:>6.2f}" for s in row), flush=True)


if __name__ == "__main__":
    main()
