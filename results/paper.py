"""The BurstEngine paper's published numbers as result rows (``source="paper"``).

The CSVs in ``results/paper_reference/`` are copies of ``../shared/paper_reference/`` (numbers
from the public BurstEngine repository, commit 426eb7a; see its README). They become rows of
``results.schema`` so that figures and the simulator's calibration treat them like any table:

    kernel_rows()   burstattention_kernel_32gpu.csv: attention alone, attn_tflops per GPU
    main_rows()     burstengine_main.csv: training tokens/s per GPU and reserved memory
    paper_rows()    both

Training rows also get TFLOP/s and MFU under every ``burst.flops`` convention, computed from
the published tokens/s (the paper's MFU is ``mfu_model_flops_causal``).
``method`` holds the paper's system name (megatron_cp, burstengine, ...; ``suites.paper_methods``
maps them to registry methods) and ``label`` the paper's label. The paper's checkpointing
``none`` ("w/o sele-ckpt", full layer recomputation) is our ``full``. Memory is GiB as recorded
(torch max_memory_reserved / 2**30).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from results.schema import empty_row

__all__ = ["PAPER_DIR", "kernel_rows", "main_rows", "paper_rows"]

PAPER_DIR = Path(__file__).resolve().parent / "paper_reference"
KERNEL_CSV = "burstattention_kernel_32gpu.csv"
MAIN_CSV = "burstengine_main.csv"
# the paper's checkpointing column -> ours: its "selective" is every layer recomputed but the
# attention output and LSE (our selective); its "none" (w/o sele-ckpt) is full recomputation
CHECKPOINTING = {"selective": "selective", "none": "full"}
GPUS_PER_NODE = 8  # paper_reference/README.md: every row ran on 8-GPU A800 nodes
PEAK_TFLOPS = 312.0  # A800 dense bf16 (suites/hardware/a800.toml, peak_bf16_tflops)


def _dir(path: str | os.PathLike | None) -> Path:
    """``path``, else the tables in this repository; no environment variable overrides them
    (one did: the figures and the fit then read numbers from outside the repository without a
    word)."""
    return Path(path or PAPER_DIR)


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _base(r: dict, workload: str) -> dict:
    row = empty_row()
    gpus = int(r["gpus"])
    row.update(source="paper", executor="paper", sweep=f"paper_{workload}", workload=workload,
               method=r["method"], label=r["label"], world=gpus, device="cuda",
               nodes=gpus // GPUS_PER_NODE, ranks_per_node=GPUS_PER_NODE, device_count=gpus,
               hardware="a800", device_name="NVIDIA A800-SXM4-80GB", peak_tflops=PEAK_TFLOPS,
               seq_len=int(r["seq_len"]), status=r["status"], dtype="bfloat16", causal=True,
               spec=json.dumps({"paper": r["method"]}))
    return row


def kernel_rows(path: str | os.PathLike | None = None) -> list[dict]:
    """Attention-only rows (forward + backward of one causal layer on 32 GPUs)."""
    out = []
    for r in _read(_dir(path) / KERNEL_CSV):
        row = _base(r, "attention")
        # one attention layer: nothing recomputed, no LM head, as the harness's attention rows
        row.update(batch=int(r["batch"]), heads=int(r["heads"]), kv_heads=int(r["heads"]),
                   head_dim=int(r["head_dim"]), nodes=int(r["nodes"]), checkpointing="none",
                   fused_head=False,
                   attn_tflops=float(r["tflops_per_gpu"]) if r["tflops_per_gpu"] else None)
        out.append(row)
    return out


def main_rows(path: str | os.PathLike | None = None) -> list[dict]:
    """End-to-end training rows (tokens/s per GPU, reserved memory)."""
    from burst.engine.configs import get_config
    from suites.implementations import implementation

    out = []
    for r in _read(_dir(path) / MAIN_CSV):
        row = _base(r, "train_step")
        cfg = get_config(r["model"])  # the models' attention shapes: MHA, head dim 128
        heads, head_dim = cfg.num_heads, cfg.head_dim
        tps = float(r["tokens_per_s_per_gpu"]) if r["tokens_per_s_per_gpu"] else None
        row.update(model=r["model"], batch=1, heads=heads, kv_heads=heads, head_dim=head_dim,
                   checkpointing=CHECKPOINTING[r["checkpointing"]],
                   fused_head=r["method"].startswith("burstengine"), tokens_per_s=tps,
                   time_s=int(r["seq_len"]) / tps / int(r["gpus"]) if tps else None,
                   # "GB" is GiB: the paper's runs log max_memory_reserved() / 1024**3
                   # (thunlp/BurstEngine pretrain_llama_hug_tokenizer.py, see_memory)
                   mem_reserved_bytes=float(r["memory_gb"]) * 2**30 if r["memory_gb"] else None)
        if tps:  # hardware FLOPs: what the system recomputed (Megatron's "selective" is full)
            ran = implementation(r["method"]).ran_checkpointing(row["checkpointing"])
            row.update(_model_tflops(r["model"], int(r["seq_len"]), row["time_s"], int(r["gpus"]),
                                     ran))
        out.append(row)
    return out


def _model_tflops(model: str, seq_len: int, time_s: float, gpus: int, ckpt: str) -> dict:
    """TFLOP/s and MFU of a published row under every named FLOP convention (burst.flops), so
    that published and simulated rows compare under the same convention (DESIGN.md 4)."""
    from burst.engine.configs import get_config
    from burst.flops import rate_columns

    rates = rate_columns(time_s=time_s, batch=1, seq_len=seq_len, world=gpus, peak=PEAK_TFLOPS,
                         cfg=get_config(model), checkpointing=ckpt)
    return {k: v for k, v in rates.items() if k != "tokens_per_s"}  # the published one stays


def paper_rows(path: str | os.PathLike | None = None) -> list[dict]:
    return kernel_rows(path) + main_rows(path)
