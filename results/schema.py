"""The result-row schema shared by measured runs, the simulator and the published numbers.

One row = one cell of a sweep (workload x method/options x model/shape x sequence length x
world). Measured rows (``source="measured"``), simulated rows (``"simulated"``) and the paper's
numbers (``"paper"``) share these columns, so the same tables and figures serve all three.
Failures are rows too (``status`` oom / timeout / error, with ``error``), never gaps.

``COLUMNS`` maps every column to its meaning; ``results/README.md`` renders the same table.
"""

from __future__ import annotations

__all__ = ["COLUMNS", "FAILED", "SOURCES", "STATUSES", "empty_row", "markdown_table"]

STATUSES = ("ok", "oom", "timeout", "error", "skipped", "missing")
SOURCES = ("measured", "simulated", "paper")
FAILED = ("oom", "timeout", "error")

COLUMNS: dict[str, str] = {
    # identity of the cell
    "sweep": "sweep name (the spec file's stem)",
    "cell_id": "stable hash of the cell's spec; resuming skips cells whose id is already done",
    "source": "measured | simulated | paper",
    "workload": "attention (one layer fwd+bwd) | train_step (one engine training step)",
    "method": "registry name (or import path) of the attention method",
    "label": "display label: method plus the options that distinguish it",
    "method_options": "JSON of the method's options (layout, backward, ranks_per_node, ...)",
    "model": ("model config name for train_step (7b, 14b, llama3-8b, tiny, ...; or the name of "
              "the model a spec defines: its fields are in `spec`), else empty"),
    "checkpointing": "none | full | selective | selective_half (train_step)",
    "fused_head": "fused LM head + loss on/off (train_step)",
    "seq_len": "global sequence length in tokens",
    "batch": "sequences per step",
    "heads": "query heads",
    "kv_heads": "key/value heads",
    "head_dim": "head dimension",
    "causal": "causal mask",
    "window": "sliding window (left, right) as JSON, empty for none",
    "dtype": "input dtype",
    "world": "ranks (GPUs or CPU processes)",
    "nodes": "nodes",
    "ranks_per_node": "ranks per node",
    "device": "cpu | cuda",
    "hardware": "hardware profile (simulated rows) or device name",
    # outcome
    "status": "ok | oom | timeout | error | skipped | missing",
    "error": "error text for failed cells",
    "warmup": "untimed warm-up steps before the repeats",
    "repeats": "measured repeats after warm-up",
    "time_s": "median step time over repeats, slowest rank (s)",
    "time_s_min": "fastest repeat (s)",
    "time_s_max": "slowest repeat (s)",
    "tokens_per_s": "tokens per second per device: batch * seq_len / time_s / world",
    "attn_tflops": "attention kernel TFLOP/s per device, kernel convention (bwd = 2.5 x fwd; "
                   "causal = N^2/2, exact attended pairs with a window)",
    "tflops_model_flops_causal": "TFLOP/s per device under model_flops_causal",
    "tflops_model_flops_dense": "TFLOP/s per device under model_flops_dense",
    "tflops_hardware_flops": "TFLOP/s per device under hardware_flops (its recompute as "
                             "mfu_hardware_flops says)",
    "mfu_model_flops_causal": "MFU under model_flops_causal (the papers' MFU)",
    "mfu_model_flops_dense": "MFU under model_flops_dense (counts the masked half of causal "
                             "attention, so it can exceed 1 at long sequences; a layer with a "
                             "sliding window counts its attended pairs, as model_flops_causal "
                             "does: equal to it when every layer has one)",
    "mfu_hardware_flops": "MFU under hardware_flops (model FLOPs + checkpoint recompute, "
                          "attention backward at 2x forward as Megatron counts it; flash "
                          "kernels execute 2.5x: not a PaLM-style hardware utilisation). The "
                          "recompute is that of the mode the system ran: a paper system whose "
                          "'selective' caches no attention output (Megatron-CP, DeepSpeed-"
                          "Ulysses: suites/implementations.toml) recomputes whole layers and "
                          "is counted as 'full', while checkpointing keeps the mode asked for",
    "peak_tflops": "dense bf16 peak used for MFU (TFLOP/s)",
    "mem_peak_bytes": "GPU: max_memory_allocated (absolute); CPU: transient peak above the "
                      "step's entry (profiler allocation events; a free of a block allocated "
                      "before the step is not seen): not comparable across devices",
    "mem_reserved_bytes": "GPU: max_memory_reserved (the paper's memory figure)",
    "saved_bytes": "bytes the forward keeps for backward (saved_tensors_hooks, without "
                   "parameters, + a train step's attention cache), exact on every device",
    "bytes_sent_forward": "bytes sent per rank in forward (byte counter / formula); a train "
                          "step with full (or selective_half) checkpointing includes the "
                          "attention forward its backward runs again",
    "bytes_sent_backward": "bytes sent per rank in backward",
    "bytes_sent_intra": "attention bytes (forward + backward) sent per rank to peers on the "
                        "same node (the busiest rank in this column: on a flat ring across "
                        "nodes intra + inter can exceed forward + backward)",
    "bytes_sent_inter": "attention bytes (forward + backward) sent per rank to peers on other "
                        "nodes (the busiest rank in this column)",
    "bytes_sent_other": "bytes sent per rank outside the attention layers through burst.comm: "
                        "a train step's CP gradient sum, loss and check all-reduces (measured "
                        "rows; torch's DDP/FSDP traffic across DP groups is not counted)",
    "max_err": "max abs error against the float64 reference on the unrounded inputs, where "
                "computed (so a 16-bit cell's includes its inputs' rounding; inf: the output "
                "or gradients were not finite; above suites.measure.WRONG_ABOVE for its dtype: "
                "a wrong result; either makes the row an error)",
    "max_err_ratio": "a 16-bit cell's max_err relative to rounding: per tensor (out, dq, dk, "
                     "dv) its max error over a plain same-dtype attention's on the same inputs, "
                     "the largest (this project's methods in bfloat16: 0.95-3.95 at 2-32 "
                     "ranks; an output 5% off: 9.8-17.4; scripts/bench_err_ratio.py)",
    "speedup": "time of the spec's baseline / time of this row (filled when a run's table is "
               "consolidated, by results.tables.add_speedup)",
    # provenance
    "run_id": "the sweep run (folder results/<sweep>/<run_id>/) that produced the row",
    "spec": "JSON of the full cell spec",
    "sweep_spec": "JSON of the whole sweep spec the cell was expanded from",
    "git_commit": "commit of the code that produced the row",
    "git_dirty": "uncommitted changes were present",
    "method_source": "for a method given as an import path: the file of the module that "
                     "defines the function and the sha256 of its bytes, read when the process "
                     "that made the row imported it ('<path> sha256:<16 hex>'; modules that one "
                     "imports are not covered); empty for this project's methods (git_commit)",
    "python": "Python version",
    "torch": "torch version",
    "cuda": "CUDA version (empty on CPU)",
    "nccl": "NCCL version (empty on CPU)",
    "flash_attn": "flash-attn version if installed",
    "device_name": "device name (GPU model or CPU)",
    "device_count": "devices used",
    "executor": "inline | local | slurm | simulate | paper",
    "job_id": "SLURM / submitit job id",
    "hostname": "host that ran rank 0",
    "date": "ISO-8601 UTC time the row was written",
}


def empty_row() -> dict:
    return {k: None for k in COLUMNS}


def markdown_table() -> str:
    """The column table of ``results/README.md`` (regenerate with ``python -m results.readme``)."""
    lines = ["| column | meaning |", "|---|---|"]
    lines += ["| `" + k + "` | " + v.replace("|", r"\|") + " |" for k, v in COLUMNS.items()]
    return "\n".join(lines)
