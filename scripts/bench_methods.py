"""Every CPU-capable method on the same inputs, on local gloo ranks: one table.

    python scripts/bench_methods.py                  # 4 ranks, 4096 tokens, 8 heads x 64, causal
    python scripts/bench_methods.py --tokens 2048 --repeats 5 --methods ring usp

Per method it prints the forward and forward+backward wall time (median over ``--repeats`` of the
slowest rank; ranks start each repeat together after a barrier), the bytes each rank sent
(``burst.comm`` counter; rank 0, forward / backward) and the max abs error of out, dq, dk, dv
against the float64 single-process reference. ``tp`` is the Megatron attention *block*
(hidden = heads x head_dim, QKV and output projections included), so its time is not comparable
with the cores; its error is over y and dx against a float64 block reference.

CPU timings here compare schedules and byte counts, not GPU performance: there is no overlap of
communication with compute on gloo, and the ranks share the machine's cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from _args import positive_int  # scripts/, the folder a script runs from

from baselines import registry
from baselines.tp import AttentionBlockWeights
from burst import comm
from burst.layout import length_problem, shard
from burst.reference import reference_attention
from burst.spawn import spawn

# (label, registry name, options): the default line-up at 4 ranks
LINEUP = (
    ("burst", "burst", dict(layout="zigzag", backward="auto")),
    ("burst (double ring)", "burst", dict(layout="zigzag", backward="auto", ranks_per_node=2)),
    ("ring", "ring", {}),
    ("zigzag_ring", "zigzag_ring", {}),
    ("striped_ring", "striped_ring", {}),
    ("double_ring", "double_ring", dict(ranks_per_node=2)),
    ("allgather", "allgather", {}),
    ("ulysses", "ulysses", {}),
    ("usp", "usp", dict(ulysses_degree=2, layout="zigzag")),
    ("tp (block)", "tp", {}),
)


def _problems(lineup, args) -> list[str]:
    """Why methods of the line-up cannot run these sizes, found before the reference is
    computed (inside the ranks they would end the run with a traceback)."""
    out = []
    for label, name, opts in lineup:
        method = registry.get(name)
        why = length_problem(args.tokens, args.world, method.layout(opts))
        if why is None:
            try:
                method.check(world=args.world, heads=args.heads, kv_heads=args.heads,
                             seq_local=args.tokens // args.world, causal=args.causal, **opts)
            except ValueError as e:
                why = str(e)
        if why:
            out.append(f"{label}: {why}")
    return out


def _reference(q, k, v, do, causal):
    """float64 out and grads, one head at a time (an N x N float64 score matrix per head)."""
    out, dq = torch.zeros_like(q), torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    rep = q.shape[2] // k.shape[2]
    for h in range(q.shape[2]):
        j = h // rep
        qh, kh, vh = (t[:, :, i:i + 1].clone().requires_grad_()
                      for t, i in ((q, h), (k, j), (v, j)))
        o, _ = reference_attention(qh, kh, vh, causal=causal)
        g = torch.autograd.grad(o, (qh, kh, vh), do[:, :, h:h + 1])
        out[:, :, h:h + 1] = o.detach()
        dq[:, :, h:h + 1] += g[0]
        dk[:, :, j:j + 1] += g[1]
        dv[:, :, j:j + 1] += g[2]
    return out, dq, dk, dv


def _inputs(args):
    g = torch.Generator().manual_seed(args.seed)
    b, n, h, d = 1, args.tokens, args.heads, args.head_dim
    q, k, v, do = (torch.randn(b, n, h, d, generator=g, dtype=torch.float64) for _ in range(4))
    hidden = h * d
    w = AttentionBlockWeights.random(hidden, h, h, d, generator=g, dtype=torch.float64)
    x = torch.randn(b, n, hidden, generator=g, dtype=torch.float64)
    dy = torch.randn(b, n, hidden, generator=g, dtype=torch.float64)
    return dict(q=q, k=k, v=v, do=do, w=w, x=x, dy=dy)


def _block_reference(x, w: AttentionBlockWeights, dy, causal):
    """y and dx of the attention block in float64, by hand around the per-head reference."""
    b, n, _ = x.shape
    d = w.head_dim
    q, k, v = ((x @ m).reshape(b, n, -1, d) for m in (w.wq, w.wk, w.wv))
    d_out = (dy @ w.wo.T).reshape(b, n, -1, d)
    out, dq, dk, dv = _reference(q, k, v, d_out, causal)
    y = out.reshape(b, n, -1) @ w.wo
    dx = sum(g.reshape(b, n, -1) @ m.T for g, m in ((dq, w.wq), (dk, w.wk), (dv, w.wv)))
    return y, dx


def _timed(fn, repeats: int, group=None) -> list[float]:
    out = []
    for _ in range(repeats):
        comm.barrier(group)
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _err(a, b) -> float:
    return float((a.detach().double() - b).abs().max())


def _bench_rank(rank, world, path, lineup, repeats, causal):
    data = torch.load(path, weights_only=False)
    rows = []
    for label, name, opts in lineup:
        method = registry.get(name)
        opts = {**method.options, **opts}
        if method.level == "block":
            rows.append(_bench_block(rank, world, data, method, repeats, causal, label))
            continue
        layout = method.layout(opts)
        q, k, v, do = (shard(data[t].float(), layout=layout) for t in ("q", "k", "v", "do"))
        method.check(world=world, heads=q.shape[2], kv_heads=k.shape[2], seq_local=q.shape[1],
                     causal=causal, **opts)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def fwd(leaves=leaves, method=method, opts=opts):
            return method(*leaves, causal=causal, **opts)

        def fwd_bwd(fwd=fwd, do=do):
            fwd().backward(do)

        fwd_bwd()  # warm-up (groups, caches)
        t_f = _timed(fwd, repeats)
        t_fb = _timed(fwd_bwd, repeats)
        for t in leaves:
            t.grad = None
        with comm.count_bytes() as c:
            out = fwd()
            out.backward(do)
        ref = [shard(data[t], layout=layout) for t in ("ref_out", "ref_dq", "ref_dk", "ref_dv")]
        err = max(_err(a, r) for a, r in zip((out, *(t.grad for t in leaves)), ref, strict=True))
        rows.append(dict(label=label, opts=opts, layout=layout, t_f=t_f, t_fb=t_fb,
                         fwd=c.sent("forward"), bwd=c.sent("backward"), err=err))
    return rows


def _bench_block(rank, world, data, method, repeats, causal, label):
    x = shard(data["x"].float(), layout="contiguous")
    dy = shard(data["dy"].float(), layout="contiguous")
    w = data["w"].shard(rank, world).map(lambda t: t.float().contiguous().requires_grad_())
    x = x.requires_grad_()

    def fwd():
        return method.block_fn(x, w, causal=causal)

    def fwd_bwd():
        fwd().backward(dy)

    fwd_bwd()
    t_f, t_fb = _timed(fwd, repeats), _timed(fwd_bwd, repeats)
    x.grad = None
    with comm.count_bytes() as c:
        y = fwd()
        y.backward(dy)
    err = max(_err(y, shard(data["ref_y"], layout="contiguous")),
              _err(x.grad, shard(data["ref_dx"], layout="contiguous")))
    return dict(label=label, opts={}, layout="contiguous", t_f=t_f, t_fb=t_fb,
                fwd=c.sent("forward"), bwd=c.sent("backward"), err=err)


def _table(per_rank: list[list[dict]], args) -> str:
    lines = [f"{args.world} ranks (gloo, 1 thread each), {args.tokens} tokens, "
             f"{args.heads} heads x {args.head_dim}, {'causal' if args.causal else 'full'}, "
             f"float32, median of {args.repeats} (slowest rank)", "",
             "| method | options | fwd ms | fwd+bwd ms | sent fwd MiB | sent bwd MiB "
             "| max err vs fp64 |", "|---|---|---:|---:|---:|---:|---:|"]
    for i, row in enumerate(per_rank[0]):
        t_f = statistics.median(max(r[i]["t_f"][j] for r in per_rank) for j in range(args.repeats))
        t_fb = statistics.median(max(r[i]["t_fb"][j] for r in per_rank)
                                 for j in range(args.repeats))
        err = max(r[i]["err"] for r in per_rank)
        opts = ", ".join(f"{k}={v}" for k, v in row["opts"].items())
        lines.append(f"| {row['label']} | {opts} | {1e3 * t_f:.0f} | {1e3 * t_fb:.0f} | "
                     f"{row['fwd'] / 2**20:.2f} | {row['bwd'] / 2**20:.2f} | {err:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=positive_int, default=4)
    p.add_argument("--tokens", type=positive_int, default=4096, help="global sequence length")
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--head-dim", type=positive_int, default=64)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--methods", nargs="*", help="labels or registry names (default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    valid = list(dict.fromkeys(x for label, name, _ in LINEUP for x in (label, name)))
    unknown = [m for m in args.methods or () if m not in valid]
    if unknown:
        p.error(f"unknown --methods {', '.join(map(repr, unknown))}; valid: "
                f"{', '.join(map(repr, valid))}")
    if args.methods:
        lineup = [row for row in LINEUP if row[0] in args.methods or row[1] in args.methods]
    else:  # all, less those a full mask rules out; named ones are checked below and refused
        lineup = [row for row in LINEUP
                  if args.causal or not registry.get(row[1]).causal_only]
    problems = _problems(lineup, args)
    if problems:
        p.error("; ".join(problems) + "; change --world, --tokens or --heads, or leave these "
                "methods out with --methods")
    t0 = time.perf_counter()
    data = _inputs(args)
    ref = _reference(data["q"], data["k"], data["v"], data["do"], args.causal)
    data.update(zip(("ref_out", "ref_dq", "ref_dk", "ref_dv"), ref, strict=True))
    if any(registry.get(name).level == "block" for _, name, _ in lineup):
        data["ref_y"], data["ref_dx"] = _block_reference(data["x"], data["w"], data["dy"],
                                                         args.causal)
    print(f"float64 reference: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-methods-") as tmp:
        path = os.path.join(tmp, "data.pt")
        torch.save(data, path)
        per_rank = spawn(_bench_rank, args.world, timeout_s=3000,
                         args=(path, lineup, args.repeats, args.causal))
    print(_table(per_rank, args))


if __name__ == "__main__":
    main()
