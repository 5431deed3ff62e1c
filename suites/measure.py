"""Measure one cell on this rank of an initialised process group (issue 5, "Runs").

``measure(cell)`` runs on every rank and returns the same metrics dict on every rank (the
cross-rank reductions happen inside), keyed by ``results.schema`` column names:

- inputs: each rank generates its own shard directly on its device (no rank ever holds the full
  sequence), except cells small enough for the float64 reference, which generate the full
  sequence in float64 and shard it so the reference sees the same numbers;
- warm-up steps, then one untimed instrumented step: bytes sent per rank by phase and link
  (``burst.comm.count_bytes``), bytes saved for backward (``SavedBytes``), on CPU the profiler's
  transient peak (``ProfilerPeak``), and the max error against the float64 reference;
- ``repeats`` timed steps: CUDA events on GPU, ``perf_counter`` after a barrier on CPU; each
  repeat counts the slowest rank (all-reduce max); ``time_s`` is their median;
- throughput: tokens/s per device, TFLOP/s and MFU per named FLOP convention (DESIGN.md 4,
  ``burst.flops``): the kernel convention for the attention workload, the three model
  conventions for train_step.
Memory and bytes are the maximum over ranks (the busiest rank bounds what fits and what waits).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import statistics
import sys

import torch

from baselines import registry
from burst import comm, flops
from burst.flops import MFU_DTYPES, peak_tflops
from burst.layout import local_index, shard
from burst.memory import ProfilerPeak, SavedBytes, cuda_peak, parameter_storages, reset_cuda_peak
from burst.timing import synchronize, time_call
from suites import spec
from suites.cells import Cell

__all__ = ["device_name", "measure", "peak_tflops"]

DTYPES = {name: getattr(torch, name) for name in spec.DTYPES}  # what a spec may name
# a max abs error (out, dq, dk, dv; unit-normal inputs) above these is a wrong result, not
# rounding: the tests hold float32 to 2e-5 and 16-bit to 3x a plain implementation in the same
# dtype (a few 1e-2); a method that ignores the causal mask is off by ~5
WRONG_ABOVE = {"float64": 1e-6, "float32": 1e-2, "bfloat16": 0.5, "float16": 0.5}
# A 16-bit cell's max_err_ratio: each tensor's max error over that of a plain attention in
# the cell's dtype on the same inputs (burst.reference.naive_attention; at least PLAIN_FLOOR),
# the largest. Information, not a verdict: in bfloat16 (causal, 1K tokens, 2-32 gloo ranks;
# scripts/bench_err_ratio.py, results/err_ratio.txt) this project's methods read 0.95-3.95
# (zigzag_ring with bf16 dK/dV the most; 1.0-4.9 at 1K-4K tokens when first measured), and
# tests.harness_methods.off_by_five_percent 9.8-17.4, which WRONG_ABOVE's 0.5 lets pass
# (0.22-0.27): no fixed ratio tells the two apart at every scale
TENSORS = ("out", "dq", "dk", "dv")
PLAIN_FLOOR = 1e-3

def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo's on Linux (``platform.processor()`` is empty
    there), else ``platform.processor()``; empty when neither says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return cpu_model() or platform.machine()


def _device(cell: Cell) -> torch.device:
    if cell.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Workloads: each returns (step, finish) where step() runs one forward+backward


def _attention(cell: Cell, dev: torch.device):
    from burst.engine.attention_call import output_problem

    method = registry.get(cell.method)
    opts = dict(cell.options)
    layout = method.layout(opts)
    method.check(world=cell.world, heads=cell.heads, kv_heads=cell.kv_heads,
                 seq_local=cell.seq_local, causal=cell.causal, **opts)
    mask = {"window": cell.window} if cell.window else {}
    dtype = DTYPES[cell.dtype]
    b, h, hk, d = cell.batch, cell.heads, cell.kv_heads, cell.head_dim
    me, g = comm.rank(), cell.world
    full = None
    if cell.compute_error:  # small: everyone draws the same full float64 inputs, then shards
        gen = torch.Generator().manual_seed(cell.seed)
        full = [torch.randn(b, cell.seq_len, x, d, generator=gen, dtype=torch.float64)
                for x in (h, hk, hk, h)]
        q, k, v, do = (shard(t, layout=layout, world=g, rank=me).to(dev, dtype) for t in full)
    else:  # large: only this rank's shard ever exists
        gen = torch.Generator(device=dev).manual_seed(cell.seed * 100003 + me)
        q, k, v, do = (torch.randn(b, cell.seq_local, x, d, generator=gen, device=dev,
                                   dtype=dtype) for x in (h, hk, hk, h))

    def step():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = method(qq, kk, vv, causal=cell.causal, **mask, **opts)
        out = out[0] if isinstance(out, tuple) else out
        if why := output_problem(out, qq):  # a float16 output of a float32 cell was an ok
            raise ValueError(f"method {cell.method!r}: {why}")  # row (error under the limit)
        if not out.requires_grad:  # torch's "element 0 of tensors does not require grad"
            raise ValueError(f"method {cell.method!r}: its output does not require grad (made "
                             "outside autograd, or detached): a cell runs the backward too")
        with comm.unlabelled_phase("backward"):  # a user's method sends without labels
            out.backward(do)
        return out.detach(), qq.grad, kk.grad, vv.grad

    def error(result) -> tuple[float, float, int] | None:  # once, on the untimed step's
        if none := [n for n, g in zip("qkv", result[1:], strict=True) if g is None]:
            raise ValueError(f"method {cell.method!r}: its output does not depend on "
                             f"{', '.join(none)} (no gradient reached it): not attention")
        return _max_err(cell, full, result, layout) if full is not None else None

    return step, error


def _max_err(cell: Cell, full, result, layout: str) -> tuple[float, float, int]:
    """(max abs error of out, dq, dk, dv against the float64 reference; for a 16-bit cell the
    largest ratio of a tensor's max error to a plain attention's in the cell's dtype on the
    same inputs, else 0; the index in ``TENSORS`` of the tensor with the largest error).
    Rank 0 computes it one query head of one sequence at a time, so the reference never
    holds more than one N x N score matrix (a kv group's, batch x heads of them, ran out of
    memory where the method fitted, and the row said the method was OOM: a harness audit);
    the plain attention's dK, dV sum its heads' gradients in float32, as the methods'
    accumulators do (summed in bfloat16 they grew with the group). Other ranks return
    (0, 0, -1)."""
    from burst.reference import naive_attention, reference_attention

    got = [_unshard(t, cell, layout) for t in result]  # out, dq, dk, dv
    if comm.rank() != 0:
        return 0.0, 0.0, -1
    dev = result[0].device  # float64 on the cell's device: fast on a GPU
    q, k, v, do = full
    rep = cell.heads // cell.kv_heads
    low = cell.dtype in ("bfloat16", "float16")
    dtype = DTYPES[cell.dtype]
    err, plain = [0.0] * 4, [0.0] * 4  # per tensor: the method's, a plain attention's

    def worst(errs, i, a, want):  # the method's results are on the host, the plain one's not
        e = float((a.detach().double().cpu() - want.detach().double().cpu()).abs().max())
        errs[i] = math.inf if math.isnan(e) else max(errs[i], e)  # max(x, nan) drops NaN

    def heads(t, kv, typ):  # (a 16-bit one's values, held in float32 for the sums)
        t = t[:, :, kv:kv + 1] if typ is torch.float64 else t[:, :, kv:kv + 1].to(typ)
        return t.to(dev, torch.float64 if typ is torch.float64 else torch.float32,
                    copy=True).requires_grad_()

    mask = dict(causal=cell.causal, window=cell.window, scale=cell.head_dim ** -0.5)
    for kv in range(cell.kv_heads):
        kh, vh = heads(k, kv, torch.float64), heads(v, kv, torch.float64)
        kl, vl = (heads(k, kv, dtype), heads(v, kv, dtype)) if low else (None, None)
        for h in range(kv * rep, (kv + 1) * rep):
            for b in range(q.shape[0]):  # dK, dV sum over the group's heads in kh/vh.grad
                one = (slice(b, b + 1), slice(None), slice(h, h + 1))
                qh = q[one].to(dev, copy=True).requires_grad_()
                out, _ = reference_attention(qh, kh[b:b + 1], vh[b:b + 1], **mask)
                out.backward(do[one].to(dev))
                worst(err, 0, got[0][one], out.detach())
                worst(err, 1, got[1][one], qh.grad)
                if low:
                    ql = q[one].to(dev, dtype, copy=True).requires_grad_()
                    mine = naive_attention(ql, kl[b:b + 1].to(dtype), vl[b:b + 1].to(dtype),
                                           **mask)
                    mine.backward(do[one].to(dev, dtype))
                    worst(plain, 0, mine.detach(), out.detach())
                    worst(plain, 1, ql.grad, qh.grad)
        worst(err, 2, got[2][:, :, kv:kv + 1], kh.grad)
        worst(err, 3, got[3][:, :, kv:kv + 1], vh.grad)
        if low:
            worst(plain, 2, kl.grad, kh.grad)
            worst(plain, 3, vl.grad, vh.grad)
    ratio = max(e / max(p, PLAIN_FLOOR) for e, p in zip(err, plain, strict=True)) if low else 0
    return max(err), ratio, max(range(4), key=err.__getitem__)


def _unshard(t: torch.Tensor, cell: Cell, layout: str) -> torch.Tensor:
    # gather on the tensor's device (NCCL cannot move CPU tensors), then assemble on the CPU
    parts = [p.cpu() for p in comm.all_gather_list(t.detach().contiguous())]
    out = torch.empty(t.shape[0], cell.seq_len, *t.shape[2:], dtype=t.dtype)
    for r, part in enumerate(parts):
        out[:, local_index(cell.seq_len, cell.world, r, layout)] = part
    return out


def _train_step(cell: Cell, dev: torch.device):
    from burst.engine.trainer import Trainer

    method = registry.get(cell.method)
    trainer = Trainer(cell.config(), attention=method,
                      attention_options=dict(cell.options), cp_group=None,
                      checkpointing=cell.checkpointing, fused_head=cell.fused_head,
                      dtype=DTYPES[cell.dtype], device=dev, window=cell.window,
                      data_parallel=cell.data_parallel or "ddp")
    if dev.type == "cuda":  # the whole parameters that passed through the device one at a
        torch.cuda.empty_cache()  # time while FSDP's shards were filled: freed, still reserved
    tokens, targets, positions = trainer.local_batch(cell.seq_len, cell.batch, cell.seed)

    def step():
        return trainer.step(tokens, targets, positions)

    # parameters are saved by every matmul whatever the checkpointing: not activations; the
    # selective modes keep their attention outside autograd, in the model's cache
    # (asked at each new storage saved: under FSDP they are the weights gathered for the
    # layer running now)
    step.params = lambda: parameter_storages(trainer.model)
    step.cached = lambda: trainer.model.cache.peak_nbytes
    return step, lambda result: None


# ---------------------------------------------------------------------------------------------
# The measurement loop


def _timed(step, dev: torch.device) -> float:
    comm.barrier()
    return time_call(step, dev)


def _max_over_ranks(values: list[float], dev: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    comm.all_reduce(t, op="max")
    return t.tolist()


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the profiler's C++ start/stop lines (kineto logs them at every use); Python
    errors still propagate as exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _finite(result) -> bool:
    """Whether a step's result (attention: out, dq, dk, dv; training: the loss) is finite."""
    if isinstance(result, torch.Tensor):
        return bool(torch.isfinite(result).all())
    if isinstance(result, tuple | list):
        return all(_finite(r) for r in result)
    return result is None or math.isfinite(float(result))


def step_calls(cell: Cell) -> int:
    """How many times ``measure`` runs a cell's step: its warmup, one untimed instrumented step,
    on CUDA with the error check one more (after the float64 reference's memory is freed),
    and the timed repeats."""
    return cell.warmup + 1 + (cell.device == "cuda" and cell.compute_error) + cell.repeats


def measure(cell: Cell) -> dict:
    """Metrics of one cell (schema column names), identical on every rank."""
    method = registry.get(cell.method)
    why = method.unavailable()
    if why:  # decided identically on every rank, before any communication
        return {"status": "skipped", "error": why}
    dev = _device(cell)
    step, error = (_attention if cell.workload == "attention" else _train_step)(cell, dev)
    for _ in range(cell.warmup):
        step()
    synchronize(dev)

    # one untimed, instrumented step
    saved = SavedBytes(exclude=getattr(step, "params", ()))
    prof = ProfilerPeak() if cell.profile_memory else None
    with comm.count_bytes(ranks_per_node=cell.ranks_per_node) as cnt, saved:
        if prof is not None:
            with _quiet_stderr(), prof:
                result = step()
        else:
            result = step()
    synchronize(dev)
    err = error(result)
    # every cell, checked against the reference or not (too long for it): NaN is not a timing
    nonfinite = 0.0 if _finite(result) else 1.0
    del result

    if dev.type == "cuda":  # a CPU cell must not create a CUDA context on a GPU host
        if cell.compute_error:  # (the same on every rank: the extra step is collective)
            # the float64 reference's freed blocks stay reserved, and a peak reset keeps what
            # is reserved: they entered mem_reserved_bytes (x2 at 4K tokens, GiBs with GQA).
            # Freed, then one untimed step: the timed ones start from a warm cache as before.
            # cuBLAS keeps a workspace per stream from its first GEMM (the float64 reference's,
            # where the cell's own step may run none): freed too, as torch's leak checks do
            gc.collect()
            if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
                torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
            step()
            synchronize(dev)
        reset_cuda_peak(dev)
    times = _max_over_ranks([_timed(step, dev) for _ in range(cell.repeats)], dev)
    peak = cuda_peak(dev) if dev.type == "cuda" else {"allocated": prof.peak_bytes if prof
                                                      else 0, "reserved": 0}
    kept = saved.bytes + (step.cached() if hasattr(step, "cached") else 0)
    fwd, bwd = cnt.sent("forward"), cnt.sent("backward")
    by_link = {lk: cnt.sent("forward", lk) + cnt.sent("backward", lk) for lk in ("intra", "inter")}
    per_rank = [kept, peak["allocated"], peak["reserved"], fwd, bwd, by_link["intra"],
                by_link["inter"], cnt.sent() - fwd - bwd, nonfinite,
                *(err if err is not None else (-1.0, 0.0, -1))]
    mx = _max_over_ranks(per_rank, dev)
    t = statistics.median(times)
    out = {
        "status": "ok", "time_s": t, "time_s_min": min(times), "time_s_max": max(times),
        "saved_bytes": int(mx[0]),
        "mem_peak_bytes": int(mx[1]) if dev.type == "cuda" or prof else None,
        "mem_reserved_bytes": int(mx[2]) if dev.type == "cuda" else None,
        "bytes_sent_forward": int(mx[3]), "bytes_sent_backward": int(mx[4]),
        "bytes_sent_intra": int(mx[5]), "bytes_sent_inter": int(mx[6]),
        "bytes_sent_other": int(mx[7]), "max_err": mx[9] if err is not None else None,
        "max_err_ratio": mx[10] if err is not None and mx[10] else None,
    }
    worst, where = mx[9], TENSORS[int(mx[11])]
    counted = cell.method in registry.names() and registry.get(cell.method).counted
    if not counted and cell.world > 1 and not any(mx[3:7]):
        # a method of the user's (an import path) or an external package's adapter whose
        # attention sent nothing through burst.comm talks through torch.distributed itself: its
        # bytes are unknown, not 0 (0 won every bytes comparison); the rest of a training step
        # (loss, gradients) is still ours
        for k in ("bytes_sent_forward", "bytes_sent_backward", "bytes_sent_intra",
                  "bytes_sent_inter"):
            out[k] = None
    if mx[8] or err is not None and not math.isfinite(worst):
        what = "output or gradients" if cell.workload == "attention" else "the loss"
        out.update(status="error", error=f"{what} not finite (NaN or inf) on some rank, where "
                                         "the float64 reference is finite" if err is not None
                   else f"{what} not finite (NaN or inf) on some rank (inputs are unit-normal)")
    elif err is not None and worst > WRONG_ABOVE[cell.dtype]:
        out.update(status="error", error=f"wrong results: max abs error {worst:.3g} (in "
                                         f"{where}) against the float64 reference, above "
                                         f"{WRONG_ABOVE[cell.dtype]:g} (far beyond "
                                         f"{cell.dtype} rounding on unit-normal inputs)")
    name = device_name(cell.device)
    # MFU only where the peak applies: a GPU cell in bf16/fp16 (fp32 has no such peak)
    peak_tf = peak_tflops(name) if cell.device == "cuda" and cell.dtype in MFU_DTYPES else None
    out.update(device_name=name, hardware=name, peak_tflops=peak_tf)
    cfg = None
    if cell.workload == "train_step":
        cfg = cell.config()
    out.update(flops.rate_columns(time_s=t, batch=cell.batch, seq_len=cell.seq_len,
                                  world=cell.world, peak=peak_tf, cfg=cfg,
                                  checkpointing=cell.checkpointing, heads=cell.heads,
                                  head_dim=cell.head_dim, causal=cell.causal, window=cell.window))
    if out["status"] != "ok":  # a wrong or non-finite result has no rate: nothing to average
        out.update({k: None for k in out if k.startswith(("time_s", "tokens_per_s", "attn_tflops",
                                                          "tflops_", "mfu_"))})
    return out
