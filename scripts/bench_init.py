"""Seconds one rank spends drawing its weights at init (``burst.engine.init``), on CPU.

    .venv/bin/python scripts/bench_init.py [--config 7b] [--ranks 1 8 32 64]

Under FSDP's ``Shard(0)`` cut, rank 0 of G draws the first ceil(rows / G) rows of every matrix
(the norms are ones); G = 1 is the whole draw, which every rank made before the init was drawn
in seeded blocks of rows. One host thread, as each of a node's ranks gets about one core.
"""

from __future__ import annotations

import argparse
import time

import torch

from burst.engine.configs import CONFIGS, get_config
from burst.engine.init import init_rows
from burst.engine.model import CausalLM


def draw_seconds(config: str, ranks: int) -> tuple[int, float]:
    """(values drawn, seconds) of rank 0 of ``ranks``."""
    params = list(CausalLM.skeleton(get_config(config)).named_parameters())
    start, drawn = time.perf_counter(), 0
    for name, param in params:
        if param.dim() > 1:
            stop = -(-param.shape[0] // ranks)
            drawn += init_rows(name, param.shape, 0, 0.02, 0, stop).numel()
    return drawn, time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="7b", choices=sorted(CONFIGS))
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 32, 64])
    a = p.parse_args(argv)
    if min(a.ranks) < 1:
        p.error("--ranks: each must be at least 1")
    torch.set_num_threads(1)
    print(f"{'ranks':>6} {'values drawn by rank 0':>24} {'seconds':>8}")
    for g in a.ranks:
        n, s = draw_seconds(a.config, g)
        print(f"{g:>6} {n:>24,} {s:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
