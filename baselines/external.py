"""The real packages, on GPU: ring-flash-attention and yunchang (USP), behind the same interface.

Both need CUDA and flash-attn, which cannot be installed on CPU machines, so nothing is imported
until a call: importing the suite never fails, and ``Method.unavailable()`` says in one line what
is missing and how to install it. The suite's own CPU implementations of the same algorithms are
``ring``/``zigzag_ring``/``striped_ring`` and ``usp``.

``ring_flash_attn`` (zhuzilin/ring-flash-attention): the ``layout`` option picks the function:
  contiguous -> ring_flash_attn_func, zigzag -> zigzag_ring_flash_attn_func,
  striped -> stripe_flash_attn_func;
each called as ``fn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, ..., group=None)``
on (batch, seq_local, heads, head_dim) fp16/bf16 shards (bf16 only for the contiguous ring, whose
backward rounds dq to bf16). The zigzag and stripe functions are causal-only (they assert it).
Its striped layout is ours (token t on rank t mod G).

``yunchang`` (feifeibear/long-context-attention): ``LongContextAttention(ring_impl_type="basic")``
called as ``attn(q, k, v, softmax_scale=..., causal=...)``. It reads its Ulysses and ring process
groups from package globals (``yunchang.globals.PROCESS_GROUP``, normally filled by
``set_seq_parallel_pg``, which builds groups over the whole world). Here the groups are built
from the ``group`` argument (``baselines.usp.usp_groups``: Ulysses over consecutive ranks, as
``use_ulysses_low=True``) and set only while the module is constructed, then restored. Only the
contiguous layout is offered: yunchang's zigzag expects a two-level sharding (zigzag over the ring
degree, then contiguous over the Ulysses degree) that is not one of the suite's layouts.

Neither package's traffic passes through ``burst.comm``, so the byte counter cannot see it;
``burst.volume.method_bytes`` gives their analytic bytes (same as ``ring``/``usp`` untruncated).
"""

from __future__ import annotations

import importlib
from functools import cache, lru_cache, partial

import torch

from baselines.checks import check_call, degree_problems, layout_problems
from baselines.registry import Method, register
from baselines.usp import usp_groups
from burst import comm
from burst.layout import LAYOUTS

__all__ = ["ring_flash_attn_adapter", "yunchang_adapter"]

_RFA_FUNCS = {"contiguous": "ring_flash_attn_func", "zigzag": "zigzag_ring_flash_attn_func",
              "striped": "stripe_flash_attn_func"}


@cache
def _import_error(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        return module
    except Exception as e:  # noqa: BLE001 - a broken install is reported, never raised here
        first = str(e).splitlines()[0] if str(e) else ""
        return f"a working {module} ({type(e).__name__}: {first})"
    return None


def _unavailable(name: str, modules: tuple[str, ...], install: str) -> str | None:
    missing = [why for m in modules if (why := _import_error(m))]
    if not torch.cuda.is_available():
        missing.append("a CUDA device")
    if not missing:
        return None
    return f"{name} is unavailable: missing {', '.join(missing)}; install with `{install}` on a " \
        "CUDA machine"


FLASH_DTYPES = ("float16", "bfloat16")  # flash-attn's kernels (checks.check_call refuses others)


def _rfa_dtypes(*, layout: str = "zigzag", **_) -> tuple[str, ...]:
    """ring_flash_attn_func's backward returns ``dq.to(torch.bfloat16)`` whatever the input
    dtype (zhuzilin/ring-flash-attention ring_flash_attn/ring_flash_attn.py; its zigzag and
    stripe functions return q's dtype): an fp16 run would get bf16-rounded dq, silently."""
    return ("bfloat16",) if layout == "contiguous" else FLASH_DTYPES


_REFUSED = ("window", "cu_seqlens", "backend")


def _refuse_unsupported(name: str, window, cu_seqlens, backend) -> None:
    """The packages' entry points take no window, documents or kernel choice: say so by name
    (the engine and windowed sweeps pass these to every method)."""
    unsupported = [f"{k}={v!r}" for k, v in (("window", window), ("cu_seqlens", cu_seqlens))
                   if v is not None] + ([f"backend={backend!r}"] if backend != "auto" else [])
    if unsupported:
        raise ValueError(f"method {name!r} does not support {', '.join(unsupported)} (the "
                         "package's function has no such argument); use a registry method of "
                         "this project (ring, zigzag_ring, usp, ...)")


def ring_flash_attn_adapter(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                            group=None, layout: str = "zigzag", window=None, cu_seqlens=None,
                            backend: str = "auto"):
    """ring-flash-attention's ring (contiguous), zigzag or stripe function over ``group``."""
    _refuse_unsupported("ring_flash_attn", window, cu_seqlens, backend)
    check_call(RING_FLASH_ATTN, q, k, v, causal=causal, group=group, options=dict(layout=layout))
    if problem := _rfa_peers_problem(group):
        raise ValueError(problem)
    fn = getattr(importlib.import_module("ring_flash_attn"), _RFA_FUNCS[layout])
    return fn(q, k, v, softmax_scale=softmax_scale, causal=causal, group=group)


def _rfa_peers_problem(group) -> str | None:
    """Early ring-flash-attention releases (zhuzilin/ring-flash-attention
    ring_flash_attn/utils.py: RingComm without ``dist.get_global_rank``) hand group-local rank
    numbers to ``dist.P2POp``, which takes global ones: on a sub-group (the Trainer's CP group
    when DP > 1) they send to the wrong ranks, an NCCL hang or silently wrong data."""
    if group is None or comm.world_size(group) == comm.world_size():
        return None
    import inspect

    if "get_global_rank" in inspect.getsource(importlib.import_module("ring_flash_attn.utils")):
        return None
    return ("the installed ring-flash-attn sends to group-local rank numbers (its RingComm "
            "predates dist.get_global_rank) and cannot run on a sub-group of "
            f"{comm.world_size(group)} of {comm.world_size()} ranks; upgrade it "
            "(pip install -U ring-flash-attn) or run it on the whole world")


def _rfa_requires(*, seq_local, causal, layout, **_):
    out = layout_problems(layout, seq_local)
    if layout != "contiguous" and not causal:
        out.append(f"ring-flash-attn's {_RFA_FUNCS.get(layout, layout)} is causal-only; use "
                   "causal=True or layout='contiguous'")
    return out


ring_flash_attn_adapter.refuses = _REFUSED  # spec validation: no such options


RING_FLASH_ATTN = register(Method(
    name="ring_flash_attn",
    fn=ring_flash_attn_adapter,
    description="ring-flash-attention package (GPU): ring / zigzag / stripe flash functions",
    layouts=LAYOUTS,
    options={"layout": "zigzag"},
    requires=_rfa_requires,
    unavailable=partial(_unavailable, "ring_flash_attn", ("flash_attn", "ring_flash_attn"),
                        "pip install ring-flash-attn flash-attn"),
    dtypes=_rfa_dtypes,
    counted=False,  # the package's traffic does not go through burst.comm
))


@lru_cache(maxsize=16)
def _long_context_attention(ranks: tuple[int, ...], ulysses_degree: int, uly, ring):
    from yunchang import LongContextAttention
    from yunchang.globals import PROCESS_GROUP

    saved = (PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG)
    PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = uly, ring
    try:
        return LongContextAttention(ring_impl_type="basic")
    finally:
        PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = saved


def yunchang_adapter(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                     group=None, ulysses_degree: int = 2, layout: str = "contiguous",
                     window=None, cu_seqlens=None, backend: str = "auto"):
    """yunchang's LongContextAttention (USP) with Ulysses degree U over ``group``."""
    _refuse_unsupported("yunchang", window, cu_seqlens, backend)
    check_call(YUNCHANG, q, k, v, causal=causal, group=group,
               options=dict(layout=layout, ulysses_degree=ulysses_degree))
    uly, ring, _ = usp_groups(group, ulysses_degree)
    attn = _long_context_attention(tuple(comm.group_ranks(group)), ulysses_degree, uly, ring)
    return attn(q, k, v, softmax_scale=softmax_scale, causal=causal)


def _yunchang_requires(*, world, heads, kv_heads, seq_local, layout, ulysses_degree, **_):
    return (degree_problems("ulysses_degree", ulysses_degree, world, heads, kv_heads,
                            kv_replicate=False)
            + layout_problems(layout, seq_local, ("contiguous",)))


yunchang_adapter.refuses = _REFUSED


YUNCHANG = register(Method(
    name="yunchang",
    fn=yunchang_adapter,
    description="yunchang package (GPU): LongContextAttention, Ulysses x ring (USP)",
    layouts=("contiguous",),
    options={"layout": "contiguous", "ulysses_degree": 2},
    requires=_yunchang_requires,
    unavailable=partial(_unavailable, "yunchang", ("flash_attn", "yunchang"),
                        "pip install yunchang flash-attn"),
    # its "basic" ring is ring-flash-attn's, dq rounded to bf16 likewise (yunchang/ring/
    # ring_flash_attn.py): bf16 only
    dtypes=("bfloat16",),
    counted=False,
))
