"""Measured memory and recompute figures of the BurstEngine training step (issue 4), on CPU.

    .venv/bin/python scripts/bench_engine_memory.py [--quick]

Prints three tables:
1. Fused LM head + cross-entropy against the plain head (all logits, then cross-entropy) at
   vocab 32000 and 8192 local tokens: the profiler's transient peak (``burst.memory.ProfilerPeak``,
   DESIGN.md 4), the bytes saved for backward (``SavedBytes``) and the median time of forward +
   backward over repeats, both measured in this one run (alternating, so load affects both).
2. Per checkpointing mode, one training step of a CPU-sized model on 2 gloo ranks (striped
   layout): bytes kept between forward and backward (saved tensors + the attention cache), the
   cache alone, the step's profiler peak, and the rank's step time.
3. Per mode, the recomputed attention FLOPs counted at the engine's attention call path against
   ``burst.flops.recompute_flops`` (selective_half: a quarter of the causal attention FLOPs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep the profiler's start/stop lines quiet

import torch  # noqa: E402
from _args import positive_int  # noqa: E402  (scripts/, the folder a script runs from)

from burst import flops  # noqa: E402
from burst.engine import ModelConfig, Trainer, count_attention_flops
from burst.engine.fused_loss import fused_linear_cross_entropy, plain_cross_entropy
from burst.engine.trainer import seq_len_problems
from burst.memory import ProfilerPeak, SavedBytes, parameter_storages
from burst.spawn import spawn

MiB = 2**20
VOCAB, TOKENS, HEAD_HIDDEN, CHUNK = 32000, 8192, 64, 1024
# a CPU-sized model for the checkpointing table (vocab small: the head is table 1's subject)
MODEL = ModelConfig(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=8, ffn_size=688,
                    vocab_size=1024)
MODES = flops.CHECKPOINTING


def _head_inputs(tokens: int):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, HEAD_HIDDEN, generator=g) * 0.5
    weight = torch.randn(VOCAB, HEAD_HIDDEN, generator=g) * 0.05
    targets = torch.randint(0, VOCAB, (tokens,), generator=g)
    targets[::17] = -100  # some ignored tokens
    return hidden, weight, targets


def _head_step(kind: str, hidden, weight, targets):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    scale = 1.0 / int((targets != -100).sum())
    if kind == "fused":
        loss = fused_linear_cross_entropy(h, w, targets, chunk=CHUNK, scale=scale)
    else:
        loss = plain_cross_entropy(h, w, targets, scale=scale)
    loss.backward()
    return float(loss.detach()), h.grad, w.grad


def bench_head(repeats: int, tokens: int) -> None:
    hidden, weight, targets = _head_inputs(tokens)
    res = {}
    for kind in ("plain", "fused"):
        _head_step(kind, hidden, weight, targets)  # warm-up (allocator, kernels)
        with ProfilerPeak() as p:
            loss, gh, gw = _head_step(kind, hidden, weight, targets)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with SavedBytes() as s:
            if kind == "fused":
                fused_linear_cross_entropy(h, w, targets, chunk=CHUNK)
            else:
                plain_cross_entropy(h, w, targets)
        res[kind] = dict(peak=p.peak_bytes, saved=s.bytes, loss=loss, gh=gh, gw=gw, times=[])
    for _ in range(repeats):  # alternate so that machine load hits both alike
        for kind in ("plain", "fused"):
            t0 = time.perf_counter()
            _head_step(kind, hidden, weight, targets)
            res[kind]["times"].append(time.perf_counter() - t0)
    pl, fu = res["plain"], res["fused"]
    err = max(float((fu["gh"] - pl["gh"]).abs().max() / pl["gh"].abs().max()),
              float((fu["gw"] - pl["gw"]).abs().max() / pl["gw"].abs().max()))
    print(f"\n1. LM head + cross-entropy: {tokens} local tokens, vocab {VOCAB}, hidden "
          f"{HEAD_HIDDEN}, fp32, fused chunk {CHUNK} tokens, {repeats} repeats "
          f"({torch.get_num_threads()} threads)")
    print(f"{'head':<8}{'peak MiB':>10}{'saved MiB':>11}{'median s':>10}{'min s':>8}{'loss':>10}")
    for kind in ("plain", "fused"):
        r = res[kind]
        print(f"{kind:<8}{r['peak'] / MiB:>10.1f}{r['saved'] / MiB:>11.1f}"
              f"{statistics.median(r['times']):>10.3f}{min(r['times']):>8.3f}{r['loss']:>10.5f}")
    peak_ratio = fu["peak"] / pl["peak"]
    time_ratio = statistics.median(fu["times"]) / statistics.median(pl["times"])
    print(f"fused/plain: peak {peak_ratio:.4f} (1/{1 / peak_ratio:.1f}; bound 1/8), time "
          f"{time_ratio:.3f}x (bound 1.2x), max relative gradient difference {err:.1e}")


def _modes_rank(rank: int, world: int, seq: int, repeats: int) -> list[dict]:
    rows = []
    for mode in MODES:
        tr = Trainer(MODEL, attention_options={"layout": "striped"}, checkpointing=mode,
                     loss_chunk=512)
        batch = tr.local_batch(seq, batch=1)
        tr.step(*batch)  # warm-up
        # matmuls save their weights, which is not memory that checkpointing could save
        with SavedBytes(exclude=parameter_storages(tr.model)) as s:
            loss = tr.model(batch[0], batch[2], batch[1], loss_scale=1.0)
        kept = s.bytes + tr.model.cache.nbytes
        cache = tr.model.cache.nbytes
        loss.backward()  # consume the cache
        tr.optimizer.zero_grad(set_to_none=True)
        with ProfilerPeak() as p:
            tr.forward_backward(*batch)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            tr.step(*batch)
            times.append(time.perf_counter() - t0)
        with count_attention_flops() as c:
            tr.step(*batch)
        rows.append(dict(mode=mode, kept=kept, cache=cache, peak=p.peak_bytes,
                         time=statistics.median(times), recompute=c.flops("recompute"),
                         forward=c.flops("forward")))
    return rows


def bench_modes(seq: int, repeats: int, world: int = 2) -> None:
    rows = spawn(_modes_rank, world, args=(seq, repeats), timeout_s=1200)[0]
    cfg = MODEL
    print(f"\n2. Checkpointing, one step on {world} gloo ranks (rank 0 shown): {cfg.num_layers} "
          f"layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, global sequence {seq}, "
          "striped, burst attention, fused head, fp32")
    print(f"{'mode':<16}{'kept MiB':>10}{'cache MiB':>11}{'cache B':>11}{'peak MiB':>10}"
          f"{'step s':>8}")
    for r in rows:
        print(f"{r['mode']:<16}{r['kept'] / MiB:>10.2f}{r['cache'] / MiB:>11.3f}{r['cache']:>11d}"
              f"{r['peak'] / MiB:>10.2f}{r['time']:>8.3f}")
    by = {r["mode"]: r for r in rows}
    print(f"half cache / full cache = {by['selective_half']['cache']} / {by['selective']['cache']}"
          f" = {by['selective_half']['cache'] / by['selective']['cache']:.6f}")
    print("\n3. Recomputed attention FLOPs per step (whole CP group), counted vs "
          "burst.flops.recompute_flops")
    attn_total = flops.recompute_flops(cfg, 1, seq, "full") - \
        flops.recompute_flops(cfg, 1, seq, "selective")
    print(f"{'mode':<16}{'counted':>14}{'formula':>14}{'of causal attn':>16}")
    for r in rows:
        m = r["mode"]
        formula = max(flops.recompute_flops(cfg, 1, seq, m) -
                      flops.recompute_flops(cfg, 1, seq, "selective"), 0.0)
        verdict = "ok" if r["recompute"] == formula else "MISMATCH"
        print(f"{m:<16}{r['recompute']:>14.4g}{formula:>14.4g}"
              f"{r['recompute'] / attn_total:>16.3f}  {verdict}")
    print(f"forward attention FLOPs counted: {rows[0]['forward']:.4g} (formula "
          f"{attn_total:.4g})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=5)
    ap.add_argument("--seq", type=positive_int, default=2048, help="global sequence of table 2")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats (smoke run)")
    args = ap.parse_args(argv)
    tokens, repeats = (TOKENS // 4, 2) if args.quick else (TOKENS, args.repeats)
    seq = args.seq // (4 if args.quick else 1)
    for mode in MODES:  # before table 1's minutes, not inside table 2's ranks
        why = seq_len_problems(MODEL, seq, cp_size=2, layout="striped", checkpointing=mode)
        if why:
            ap.error(f"--seq {args.seq}{' (/4 with --quick)' * args.quick}: {why[0]}")
    bench_head(repeats, tokens)
    bench_modes(seq, repeats)


if __name__ == "__main__":
    main()
