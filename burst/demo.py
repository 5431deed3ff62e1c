"""A small BurstAttention-vs-reference demo on 4 local CPU ranks (``python -m burst.demo``).

Prints, per layout and backward scheme, the max error of out and dq/dk/dv against the float64
single-process reference and the MiB rank 0 sent, as one table.
"""

from __future__ import annotations

import torch

from burst import burst_attn, comm, shard
from burst.reference import reference_attention
from burst.spawn import spawn


def _run(rank: int, world: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    b, n, h, d = 1, 256 * world, 8, 64
    q, k, v, do = (torch.randn(b, n, h, d, generator=g, dtype=torch.float64) for _ in range(4))
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    out_ref, _ = reference_attention(*ref, causal=True)
    out_ref.backward(do)
    rows = []
    for layout in ("contiguous", "zigzag", "striped"):
        for backward in ("burst", "ring"):
            loc = [shard(t.float(), layout=layout).requires_grad_() for t in (q, k, v)]
            with comm.count_bytes() as c:
                out = burst_attn(*loc, causal=True, layout=layout, backward=backward)
                out.backward(shard(do.float(), layout=layout))
            want = [shard(t, layout=layout) for t in (out_ref, ref[0].grad, ref[1].grad,
                                                      ref[2].grad)]
            err = max(float((a.double() - w).abs().max())
                      for a, w in zip((out.detach(), *(t.grad for t in loc)), want, strict=True))
            rows.append(dict(layout=layout, backward=backward, max_err=err,
                             fwd_MB=c.sent("forward") / 2**20, bwd_MB=c.sent("backward") / 2**20))
    return rows


def main() -> None:
    world = 4
    print(f"BurstAttention on {world} CPU ranks (gloo), causal, 1x{256 * world} tokens, "
          "8 heads x 64, float32, vs float64 reference")
    rows = spawn(_run, world)[0]
    print(f"{'layout':<11}{'backward':<9}{'max err':>10}{'fwd MiB r0':>13}{'bwd MiB r0':>13}")
    for r in rows:
        print(f"{r['layout']:<11}{r['backward']:<9}{r['max_err']:>10.2e}{r['fwd_MB']:>13.2f}"
              f"{r['bwd_MB']:>13.2f}")


if __name__ == "__main__":
    main()
