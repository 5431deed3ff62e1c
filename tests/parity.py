"""Distributed parity cases: any registry method against the float64 single-process reference.

A case is a dict; ``run_cases`` runs a list of them on every rank of one spawn (spawning costs
seconds, so one spawn serves many cases) and returns, per case, the max errors of out, lse and
dq/dk/dv against the float64 oracle, the errors of the naive same-dtype implementation (for the
low-precision tolerance rule) and the bytes this rank sent/received by (phase, link).

Case keys: method, options, world-independent shape (batch, seq_local, heads, kv_heads,
head_dim), causal, window, cu_seqlens, dtype, seed, ranks_per_node (links for the counter),
expect_error (substring: the call must raise ValueError containing it).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from baselines import registry
from burst import comm
from burst.layout import shard
from burst.reference import naive_attention, reference_attention

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def case(method="burst", *, options=None, batch=1, seq_local=8, heads=4, kv_heads=4, head_dim=8,
         causal=True, window=None, cu_seqlens=None, dtype="float32", seed=0, ranks_per_node=None,
         expect_error=None, naive=False) -> dict:
    return dict(method=method, options=options or {}, batch=batch, seq_local=seq_local,
                heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal, window=window,
                cu_seqlens=cu_seqlens, dtype=dtype, seed=seed, ranks_per_node=ranks_per_node,
                expect_error=expect_error, naive=naive)


def _full_inputs(c: dict, world: int):
    g = torch.Generator().manual_seed(c["seed"])
    n = c["seq_local"] * world
    b, h, hk, d = c["batch"], c["heads"], c["kv_heads"], c["head_dim"]
    q = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, n, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, n, hk, d, generator=g, dtype=torch.float64)
    do = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    return q, k, v, do


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    res = fn(q, k, v)
    out, lse = res if isinstance(res, tuple) else (res, None)
    out.backward(do)
    return out.detach(), lse, q.grad, k.grad, v.grad


# low precision, whole rings (burst/reference.py): RMS error within RING_RMS x and max error
# within RING_MAX x a plain same-dtype implementation's (a ring rounds each block's partial
# result to the input dtype, so its max error exceeds flash-attention's single-kernel 2x)
RING_RMS, RING_MAX = 1.25, 3.0
# float64 inputs: every method computes in float64 and equals the oracle to rounding (random
# cases on 2-8 ranks: worst absolute error 5.3e-15, inputs and gradients of order 1-10)
F64_TOL = 1e-12
# results that are one attention call per rank: flash-attention's 2x. Not all-gather's dK/dV:
# its reduce-scatter sums G partial results in the input dtype (as TransformerEngine's does), G
# roundings like a ring's (a random bf16 case at 8 ranks: dv max error 2.3x the naive one)
ONE_CALL = {"ulysses": ("out", "dq", "dk", "dv"), "allgather": ("out", "dq")}


def _err(a, b):
    a, b = a.double(), b.double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    return float(torch.where(both_inf, torch.zeros_like(a), (a - b).abs()).max())


def _sq(a, b) -> tuple[float, int]:
    """Sum of squared errors and the element count (for an RMS over every rank's shard)."""
    return float((a.double() - b.double()).pow(2).sum()), a.numel()


def run_one(c: dict, rank: int, world: int) -> dict:
    method = registry.get(c["method"])
    opts = dict(c["options"])
    layout = method.layout(opts)
    mask_kw = dict(causal=c["causal"], window=c["window"], cu_seqlens=c["cu_seqlens"])
    q, k, v, do = _full_inputs(c, world)
    dtype = DTYPES[c["dtype"]]
    extra = {key: c[key] for key in ("window", "cu_seqlens") if c[key] is not None}
    if c["expect_error"] is not None:  # raised before any communication: nothing sent
        with comm.count_bytes() as cnt:
            try:
                method.check(world=world, heads=c["heads"], kv_heads=c["kv_heads"],
                             seq_local=c["seq_local"], causal=c["causal"], **opts)
                sh = [shard(t.to(dtype), layout=layout) for t in (q, k, v)]
                method(*sh, causal=c["causal"], **extra, **opts)
            except ValueError as e:
                return {"raised": str(e), "sent": cnt.sent()}
        return {"raised": None}

    ref = _grads(lambda a, b_, c_: reference_attention(a, b_, c_, **mask_kw), q, k, v, do)
    ref_sh = [shard(t, layout=layout) for t in (ref[0], ref[2], ref[3], ref[4])]
    ref_lse = shard(ref[1].detach(), layout=layout, dim=2)

    def dist_fn(a, b_, c_):
        return method(a, b_, c_, causal=c["causal"], **extra, **opts)

    method.check(world=world, heads=c["heads"], kv_heads=c["kv_heads"],
                 seq_local=c["seq_local"], causal=c["causal"], **opts)
    loc = [shard(t.to(dtype), layout=layout) for t in (q, k, v, do)]
    with comm.count_bytes(ranks_per_node=c["ranks_per_node"]) as cnt:
        out, _, dq, dk, dv = _grads(dist_fn, *loc)
    res = {
        "out": _err(out, ref_sh[0]), "dq": _err(dq, ref_sh[1]), "dk": _err(dk, ref_sh[2]),
        "dv": _err(dv, ref_sh[3]), "bytes": dict(cnt._sent), "recv": dict(cnt._recv),
        "layout": layout,
        "sq": {name: _sq(a, b) for name, a, b in
               zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), ref_sh, strict=True)},
    }
    if method.name == "burst":  # lse is part of burst_attn's public contract
        from burst import burst_attn

        loc_q, loc_k, loc_v = loc[:3]
        _, lse = burst_attn(loc_q, loc_k, loc_v, return_lse=True, **mask_kw,
                            **{kk: vv for kk, vv in opts.items() if kk != "backward"})
        res["lse"] = _err(lse, ref_lse)
    if c["naive"]:
        nv = _grads(lambda a, b_, c_: naive_attention(a, b_, c_, **mask_kw),
                    *(t.to(dtype) for t in (q, k, v, do)))
        nv_sh = [shard(t, layout=layout) for t in (nv[0], nv[2], nv[3], nv[4])]
        res["naive"] = {name: _err(a, b) for name, a, b in
                        zip(("out", "dq", "dk", "dv"), nv_sh, ref_sh, strict=True)}
        res["naive_sq"] = {name: _sq(a, b) for name, a, b in
                           zip(("out", "dq", "dk", "dv"), nv_sh, ref_sh, strict=True)}
    return res


def run_cases(rank: int, world: int, cases: list[dict]) -> list[dict]:
    torch.manual_seed(0)
    return [run_one(c, rank, world) for c in cases]


def _rms(parts: list[tuple[float, int]]) -> float:
    return math.sqrt(sum(sq for sq, _ in parts) / sum(n for _, n in parts))


def _label(c: dict) -> str:
    return (f"{c['method']} {c['options']} causal={c['causal']} window={c['window']} "
            f"docs={c['cu_seqlens']} H={c['heads']}/{c['kv_heads']} {c['dtype']}")


def check(cases: list[dict], per_rank: list[list[dict]], world: int, expected_bytes,
          f32_tol: float) -> list[str]:
    """Every failure of a spawn's results: expected errors raised, float32 errors under
    ``f32_tol`` (float64: ``F64_TOL``), bytes sent == ``expected_bytes(case, world, rank).by``
    (and received == sent), low precision within the whole-ring rule (``RING_RMS``,
    ``RING_MAX``) of the naive same-dtype error over the whole tensor."""
    failures = []
    for i, c in enumerate(cases):
        for rank in range(world):
            r = per_rank[rank][i]
            if c["expect_error"] is not None:
                if not r["raised"] or c["expect_error"] not in r["raised"]:
                    failures.append(f"{_label(c)}: expected ValueError with "
                                    f"{c['expect_error']!r}, got {r['raised']!r}")
                elif r["sent"]:
                    failures.append(f"{_label(c)}: sent {r['sent']} bytes before raising")
                continue
            tol = {"float32": f32_tol, "float64": F64_TOL}.get(c["dtype"])
            if tol is not None:
                bad = {k: r[k] for k in ("out", "lse", "dq", "dk", "dv")
                       if k in r and not r[k] < tol}
                if bad:
                    failures.append(f"rank {rank} {_label(c)}: errors {bad}")
            got = {key: v for key, v in r["bytes"].items() if v}
            want = {key: v for key, v in expected_bytes(c, world, rank).by.items() if v}
            if got != want:
                failures.append(f"rank {rank} {_label(c)}: bytes sent {got} != formula {want}")
            if sum(r["recv"].values()) != sum(r["bytes"].values()):
                failures.append(f"rank {rank} {_label(c)}: received {r['recv']} != sent")
        if c["expect_error"] is None:  # every byte sent on a (phase, link) arrives on it
            sent, recv = defaultdict(int), defaultdict(int)
            for rank in range(world):
                for key, v in per_rank[rank][i]["bytes"].items():
                    sent[key] += v
                for key, v in per_rank[rank][i]["recv"].items():
                    recv[key] += v
            if {k: v for k, v in sent.items() if v} != {k: v for k, v in recv.items() if v}:
                failures.append(f"{_label(c)}: received per phase and link {dict(recv)} != "
                                f"sent {dict(sent)}")
        if c["naive"]:  # low precision against the naive same-dtype error: the whole-ring
            for k in ("out", "dq", "dk", "dv"):  # rule, or the single-kernel 2x
                ring = k not in ONE_CALL.get(c["method"], ())
                ours = max(per_rank[r][i][k] for r in range(world))
                naive = max(per_rank[r][i]["naive"][k] for r in range(world))
                rms, rms_naive = (_rms([per_rank[r][i][key][k] for r in range(world)])
                                  for key in ("sq", "naive_sq"))
                ok = (ours <= RING_MAX * naive and rms <= RING_RMS * rms_naive if ring
                      else ours <= 2 * naive)
                if not ok:
                    failures.append(f"{_label(c)}: {k} error max {ours:.3g}, RMS {rms:.3g}; "
                                    f"naive max {naive:.3g}, RMS {rms_naive:.3g}")
    return failures


def transport_check(rank: int, world: int, device: str) -> dict:
    """Every attention-core method (tp is block-level) over the process group's own transport
    (gloo on CPU, NCCL on GPUs): float32 on ``device``, out and dq/dk/dv against the float64
    reference; {label: max abs error}; the double rings and USP need 4 ranks or more (their
    sub-groups). The GPU check runs it with NCCL on up to 4 GPUs (its other GPU tests run one
    process, so they never send a byte)."""
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    g = torch.Generator().manual_seed(3)
    n, h, d = 32 * world, 4, 64
    full = [torch.randn(1, n, h, d, generator=g, dtype=torch.float64) for _ in range(4)]
    leaves = [t.clone().requires_grad_() for t in full[:3]]
    out, _ = reference_attention(*leaves, causal=True)
    out.backward(full[3])
    ref = [out.detach(), *(t.grad for t in leaves)]
    cases = {"burst": ("burst", {"backward": "burst"}), "burst-ring": ("burst",
                                                                       {"backward": "ring"}),
             "ring": ("ring", {}), "zigzag_ring": ("zigzag_ring", {}),
             "striped_ring": ("striped_ring", {}), "allgather": ("allgather", {}),
             "ulysses": ("ulysses", {})}
    if world % 2 == 0 and world >= 4:  # the sub-group paths: two rings, Ulysses x ring
        cases["burst-double"] = ("burst", {"ranks_per_node": 2})
        cases["double_ring"] = ("double_ring", {"ranks_per_node": 2})
        cases["usp"] = ("usp", {"ulysses_degree": 2})
    errs = {}
    for label, (name, opts) in cases.items():
        method = registry.get(name)
        layout = method.layout(opts)
        q, k, v, do = (shard(t, layout=layout).to(dev, torch.float32) for t in full)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        got = method(q, k, v, causal=True, **opts)
        got.backward(do)
        errs[label] = max(float((a.detach().cpu().double() - shard(w, layout=layout)).abs().max())
                          for a, w in zip((got, q.grad, k.grad, v.grad), ref, strict=True))
    comm.barrier()
    return errs
