"""Input checks shared by the adapters: every problem at once, before any communication.

An adapter calls ``check_call`` first thing: it checks the tensors (4 dims, one dtype and device,
matching shapes, GQA divisibility) and then the method's declared requirements
(``Method.check``: layout, causal-only, the method's own ``requires``), and raises one ValueError
listing everything that is wrong together with the valid choices (STYLE.md, principle 6).
"""

from __future__ import annotations

from burst import comm
from burst.attention import qkv_problems
from burst.kernel import resolve_backend
from burst.layout import LAYOUTS, divisors, local_length_problem

__all__ = ["backend_problems", "check_call", "degree_problems", "divisors", "layout_problems",
           "qkv_problems"]




def _join(xs) -> str:
    return ", ".join(map(str, xs))


def layout_problems(layout: str, seq_local: int, layouts=LAYOUTS) -> list[str]:
    """The local length must split into the layout's chunks (zigzag: 2 per rank)."""
    if layout not in layouts:
        return []  # Method.check reports the unsupported layout with the valid ones
    why = local_length_problem(seq_local, layout)
    return [why] if why else []


def check_call(method, q, k, v, *, causal: bool, group, options: dict,
               backend: str = "auto") -> None:
    """Raise one ValueError naming every problem of this call of registry entry ``method``."""
    problems = qkv_problems(q, k, v)
    dtype, dtypes = str(q.dtype).removeprefix("torch."), method.dtypes_for(options)
    if dtypes is not None and dtype not in dtypes:
        problems.append(f"it computes in {' or '.join(dtypes)}, got {dtype}; cast the inputs")
    problems += backend_problems(backend, q)
    if problems:
        raise ValueError(f"method {method.name!r} cannot run this case: " + "; ".join(problems))
    method.check(world=comm.world_size(group), heads=q.shape[2], kv_heads=k.shape[2],
                 seq_local=q.shape[1], causal=causal, **options)


def backend_problems(backend: str, x) -> list[str]:
    """An unknown kernel backend, or one that cannot run tensors like ``x`` (a CUDA kernel on
    CPU tensors): ``resolve_backend``'s refusal, found here, not in the first kernel call after
    the all-gather or all-to-all has sent its bytes (burst_attn's own check does the same)."""
    try:
        resolve_backend(backend, x)
    except ValueError as e:
        return [str(e)]
    return []


def degree_problems(what: str, degree, world: int, heads: int, kv_heads: int, *,
                    kv_replicate: bool, of_world: bool = False) -> list[str]:
    """Problems of a head-splitting degree (Ulysses, USP, TP) for these head counts.

    Query heads must split evenly. K/V heads must split evenly too, or (``kv_replicate``) the
    degree must be a multiple of them, in which case each kv head is replicated to the
    degree/kv_heads ranks whose query heads use it. The valid degrees named are the divisors of
    the world; where the degree is the world itself (``of_world``: Ulysses, TP, which no option
    sets), the group sizes that split these heads.
    """
    if not isinstance(degree, int) or isinstance(degree, bool):  # (2.0 read as a bad divisor)
        return [f"{what}={degree!r} must be a whole number (an int) that divides the group of "
                f"{world} ranks; valid: {_join(divisors(world))}"]
    if degree < 1 or world % degree:
        return [f"{what}={degree!r} must divide the group of {world} ranks; valid: "
                f"{_join(divisors(world))}"]
    out = []
    named = "group sizes" if of_world else "degrees"
    candidates = divisors(heads) if of_world else divisors(world)
    if heads % degree:
        valid = [d for d in candidates if heads % d == 0]
        out.append(f"{what} {degree} does not divide {heads} query heads; valid {named}: "
                   f"{_join(valid)}")
    kv_ok = kv_heads % degree == 0 or (kv_replicate and degree % kv_heads == 0)
    if not kv_ok and not (out and kv_heads == heads):  # (as many kv heads: said already)
        rule = ("divide them or be a multiple of them (kv heads are then replicated)"
                if kv_replicate else "divide them")
        valid = [d for d in candidates
                 if heads % d == 0 and (kv_heads % d == 0 or (kv_replicate and d % kv_heads == 0))]
        out.append(f"{what} {degree} and {kv_heads} kv heads: the degree must {rule}; valid "
                   f"{named}: {_join(valid)}")
    return out
