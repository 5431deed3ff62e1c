"""Analytic tables behind the paper's motivation figures (no schedule, no hardware):

  attention_share   attention's share of a training step's FLOPs vs sequence length
                    (``burst.flops``, both the causal-halved and the dense convention)
  logits_memory     LM head + loss peak per GPU, plain vs fused head (``suites.memory_model``)
  checkpoint_memory activations kept per GPU between forward and backward, per checkpointing
                    mode (``suites.memory_model``)

    python -m suites.breakdowns [--out results/simulated/breakdowns.csv]

One long table: kind, model, world, seq_len, series, value, unit. Figures read it
(``paper_figures``); nothing here is fitted.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from burst import flops as F
from burst.engine.configs import get_config
from burst.flops import CHECKPOINTING
from suites.memory_model import checkpoint_bytes, head_bytes

__all__ = ["DEFAULT_OUT", "breakdown_rows", "write"]

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "simulated" / "breakdowns.csv"
SEQ_LENS = tuple(1 << k for k in range(12, 23))  # 4K .. 4M tokens
MODELS = ("7b", "14b")
WORLD = 32  # the paper's 4-node runs: memory per GPU at context parallel degree 32


def breakdown_rows(models=MODELS, seq_lens=SEQ_LENS, world: int = WORLD) -> list[dict]:
    rows = []
    for name in models:
        cfg = get_config(name)
        for n in seq_lens:
            for conv in ("model_flops_causal", "model_flops_dense"):
                rows.append(dict(kind="attention_share", model=name, world=1, seq_len=n,
                                 series=conv, value=F.attention_share(cfg, 1, n, conv),
                                 unit="fraction"))
            tokens = max(1, n // world)
            for fused in (False, True):
                rows.append(dict(kind="logits_memory", model=name, world=world, seq_len=n,
                                 series="fused head" if fused else "plain head",
                                 value=head_bytes(cfg, tokens, fused), unit="bytes"))
            for mode in CHECKPOINTING:
                rows.append(dict(kind="checkpoint_memory", model=name, world=world, seq_len=n,
                                 series=mode,
                                 value=cfg.num_layers * checkpoint_bytes(cfg, tokens, mode),
                                 unit="bytes"))
    return rows


def write(path: Path = DEFAULT_OUT, rows: list[dict] | None = None) -> Path:
    rows = breakdown_rows() if rows is None else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suites.breakdowns")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    print(f"wrote {write(a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
