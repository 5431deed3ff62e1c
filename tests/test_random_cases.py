"""Random parity cases: methods x options x masks x shapes that no one picked by hand.

The hand-picked cases of ``tests/test_baselines.py`` run at world sizes 2, 4 and 8; these draw
every CPU core method with random options (layout, backward scheme, ranks per node, Ulysses
degree, gradient accumulator), mask (causal or not, a sliding window, documents, both), heads
and kv heads, batch and shard length, at world sizes 3 and 6 (odd rings, a double ring of
nodes of 3). Each valid case must equal the float64 reference (out, dq/dk/dv; burst's lse too:
within 2e-5 with float32 inputs, 1e-12 with float64 ones) and send the bytes of its formula;
each combination ``Method.check`` refuses must raise a ValueError before sending a byte.

The engine's cases (``tests/test_engine_distributed.py``, world sizes 1, 2 and 4) are drawn the
same way at world sizes 3 and 4: method and options, checkpointing mode, fused or plain head,
tied embeddings, kv heads, window, documents, CP degree and data parallelism (DDP, FSDP over
the DP group or over every rank); the loss and every weight gradient must equal one float64
process on the whole batch, and the recomputed FLOPs and gradient all-reduce bytes their
formulas (the checks of ``tests/test_engine_distributed.py``).

Megatron's tensor-parallel attention block (``tp``, the registry's block-level method) is drawn
at world sizes 3 and 6: heads, kv heads, hidden size, batch, shard length and mask; its output,
input gradient and weight gradients must equal the float64 block and its bytes the formula.

The emulated ring (``burst.emulate``: every rank's steps in one process) is drawn at world
sizes 1-16, double rings of any node size, both backward schemes, in float64: out and
dq/dk/dv within 1e-12 of the oracle.

The simulator's cells are drawn the same way (any registered method, the GPU-only adapters
too, attention or a training step of the 7B, 14B or tiny model, any checkpointing mode and
head, on each GPU profile): every one is priced or refused with a reason, never an exception,
and doubling the sequence never shortens the time (without a window: with one, a contiguous
ring takes fewer, larger steps as the shards grow past the window, which can be faster) nor
lowers the memory, and never turns an OOM cell into one that fits.

The draws are seeded (``BURST_RANDOM_SEED``, default 0), so a failure names a case that
reproduces; another seed draws other cases:
``BURST_RANDOM_SEED=7 .venv/bin/python -m pytest tests/test_random_cases.py``.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from baselines import registry
from burst.engine import get_config
from burst.spawn import spawn
from tests import test_engine_distributed as engine
from tests.parity import case, check, run_cases
from tests.test_baselines import F32_TOL, _expected, _run_block, block_failures

SEED = int(os.environ.get("BURST_RANDOM_SEED", "0"))
CASES = 36  # per world and kind (valid, refused): about 10 s on this machine for both worlds


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _options(rng: random.Random, m, world: int, schemes=("burst", "ring"),
             grad_acc: bool = False) -> dict:
    """Random options of method ``m`` over ``world`` ranks: a layout it takes, and the
    backward scheme, inner ring, Ulysses degree (and gradient accumulator) where it has them."""
    accepted = registry.accepted_options(m.fn) or set()
    opts = {"layout": rng.choice(m.layouts)}
    if "backward" in accepted:
        opts["backward"] = rng.choice(schemes)
    if "ranks_per_node" in accepted and rng.random() < 0.7:
        opts["ranks_per_node"] = rng.choice(_divisors(world))
    if "ulysses_degree" in accepted:
        opts["ulysses_degree"] = rng.choice(_divisors(world))
    if grad_acc and "grad_acc" in accepted and rng.random() < 0.3:
        opts["grad_acc"] = rng.choice(["fp32", "input"])
    return opts


def _window(rng: random.Random, n: int, causal: bool, least: int = 0) -> tuple[int, int]:
    """(left, right) over ``n`` tokens: left >= ``least``; right 0 mostly when causal."""
    return (rng.randint(least, n), 0 if causal and rng.random() < 0.8 else rng.randint(0, n))


def _documents(rng: random.Random, n: int, most: int = 5) -> tuple[int, ...]:
    """Boundaries of 2 to ``most`` + 1 documents over ``n`` > 1 tokens."""
    return (0, *sorted(rng.sample(range(1, n), rng.randint(1, min(most, n - 1)))), n)


MASKS = ((False, False), (True, False), (False, True), (True, True))  # (window, documents)


def draw(rng: random.Random, world: int, method: str | None = None,
         mask: tuple[bool, bool] | None = None, causal: bool | None = None) -> dict:
    """One random case, valid or not (``expect_error`` is set by ``draws``); ``method``,
    ``mask`` (a window?, documents?) and ``causal`` are drawn where not given."""
    m = registry.get(method or rng.choice(registry.names(available_only=True, level="core")))
    opts = _options(rng, m, world, ("burst", "ring", "auto"), grad_acc=True)
    causal = m.causal_only or (rng.random() < 0.7 if causal is None else causal)
    heads = rng.choice([1, 2, 3, 4, 6, 8, 12])
    seq_local = rng.choice([2, 4, 6, 8, 10, 12])
    n = seq_local * world
    window = docs = None
    has_window, has_docs = mask or (rng.random() < 0.35, rng.random() < 0.35)
    if has_window:
        window = _window(rng, n, causal)
    if has_docs:
        docs = _documents(rng, n)
    return case(m.name, options=opts, batch=rng.choice([1, 2]), seq_local=seq_local,
                heads=heads, kv_heads=rng.choice(_divisors(heads)),
                head_dim=rng.choice([4, 8]), causal=causal, window=window, cu_seqlens=docs,
                ranks_per_node=rng.choice([None, *_divisors(world)]))


def _refusal(c: dict, world: int) -> str | None:
    try:
        registry.get(c["method"]).check(world=world, heads=c["heads"], kv_heads=c["kv_heads"],
                                         seq_local=c["seq_local"], causal=c["causal"],
                                         **c["options"])
    except ValueError as e:
        return str(e)
    return None


def draws(world: int, n: int, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """``n`` valid and ``n`` refused cases (refused: ``expect_error`` "", any ValueError)."""
    rng = random.Random(seed * 1000 + world)
    names = registry.names(available_only=True, level="core")
    valid, refused, tries = [], [], 0
    while len(valid) < n:  # each method and mask kind in turn, drawn again until valid
        i = len(valid)
        c = draw(rng, world, names[i % len(names)], MASKS[i // len(names) % len(MASKS)],
                 causal=i % 3 != 2)
        tries += 1
        if tries > 1000:  # (ulysses on 5 or 7 ranks: no drawn head count is a multiple)
            raise ValueError(f"no valid {names[i % len(names)]} case in 1000 draws on {world} "
                             "ranks: draw it on another world")
        if _refusal(c, world) is None:  # every fourth in float64: equal to rounding
            valid.append(dict(c, seed=i, dtype="float64" if i % 4 == 3 else "float32"))
            tries = 0
        elif len(refused) < n:
            refused.append(dict(c, seed=n + len(refused), expect_error=""))
    while len(refused) < n:
        c = draw(rng, world)
        if _refusal(c, world) is not None:
            refused.append(dict(c, seed=n + len(refused), expect_error=""))
    return valid, refused


def draw_block(rng: random.Random, world: int, i: int) -> dict:
    """A random tp block case (``tests.test_baselines._run_block``'s keys)."""
    kv = world * rng.choice([1, 2])
    seq_local = rng.choice([2, 3, 4, 6])
    n = seq_local * world
    c = dict(causal=rng.random() < 0.7, heads=kv * rng.choice([1, 2, 3]), kv_heads=kv,
             head_dim=rng.choice([4, 8]), hidden=rng.choice([8, 12, 16, 24]),
             seq_local=seq_local, batch=rng.choice([1, 2]), ranks_per_node=None, weights=True,
             seed=100 + i)
    if rng.random() < 0.4:  # left >= 1: with (0, 0) dWq and dWk are exactly 0 (no scale)
        c["window"] = _window(rng, n, c["causal"], least=1)
    if rng.random() < 0.4:
        c["cu_seqlens"] = _documents(rng, n, most=4)
    return c


BLOCKS = 8  # per world


def _run_all(rank: int, world: int, cases: list[dict], blocks: list[dict]):
    return run_cases(rank, world, cases), [_run_block(c, rank, world) for c in blocks]


@pytest.mark.parametrize("world", [3, 6])
def test_random_cases_equal_the_reference_and_their_formula(world):
    valid, refused = draws(world, CASES)
    cases = valid + refused
    rng = random.Random(SEED * 1000 + world + 500)
    blocks = [draw_block(rng, world, i) for i in range(BLOCKS)]
    out = spawn(_run_all, world, args=(cases, blocks), timeout_s=300)
    failures = check(cases, [o[0] for o in out], world, _expected, F32_TOL)
    failures += block_failures(blocks, [o[1] for o in out], world)
    assert not failures, "\n".join(failures[:20])


ENGINE_CASES = 16  # per world: about 10 s at world 3 and 4 on this machine


def draw_engine(rng: random.Random, world: int, method: str) -> dict:
    """One random Trainer case of ``method`` the engine must run (drawn again until valid)."""
    tiny = get_config("tiny")
    m = registry.get(method)
    while True:
        cp = None if rng.random() < 0.4 else rng.choice(_divisors(world))  # None: the world
        cp_size = cp or world
        opts = _options(rng, m, cp_size)
        seq = 36 if world % 3 == 0 else engine.SEQ
        window = docs = None
        if rng.random() < 0.35:  # left >= 1: with (0, 0) dq and dk are exactly 0 (no scale)
            window = (rng.randint(1, seq), 0)
        if rng.random() < 0.35:
            docs = _documents(rng, seq, most=4)
        mode = rng.choice(engine.MODES)
        kv_heads = rng.choice([1, 2, 4])
        c = engine.case(m.name, checkpointing=mode, fused=rng.random() < 0.7,
                        dtype="float64" if rng.random() < 0.8 else "float32", options=opts,
                        window=window, cu_seqlens=docs, tie=rng.random() < 0.3,
                        kv_heads=kv_heads, cp_degree=cp, seq=seq,
                        data_parallel=rng.choice(["ddp", "fsdp", "fsdp_world"]))
        if mode == "selective_half" and (m.layout(opts) != "striped" or not m.row_saves):
            continue  # the Trainer refuses these by name (tests/test_engine_distributed.py)
        try:
            m.check(world=cp_size, heads=tiny.num_heads, kv_heads=kv_heads,
                    seq_local=seq // cp_size, causal=True, **opts)
        except ValueError:
            continue
        return c


def _run_engine_cases(rank: int, world: int, cases: list[dict]) -> list[dict]:
    torch.manual_seed(0)
    return [engine._run_case(c, world) for c in cases]


@pytest.mark.parametrize("world", [3, 4])
def test_random_engine_cases_equal_one_float64_process(world):
    rng = random.Random(SEED * 1000 + world)
    names = registry.names(available_only=True, level="core")
    cases = [draw_engine(rng, world, names[i % len(names)]) for i in range(ENGINE_CASES)]
    per_rank = spawn(_run_engine_cases, world, args=(cases,), timeout_s=300)
    failures = engine.case_failures(cases, per_rank, world)
    assert not failures, "\n".join(failures[:20])


SIM_CELLS = 150  # about 5 s


def draw_cell(rng: random.Random) -> dict:
    """A random simulator cell (``suites.simulate.as_cell``'s fields), valid or not."""
    m = registry.get(rng.choice(registry.names(level="core")))
    world = rng.choice([1, 2, 4, 8, 16, 32, 64])
    cell = dict(method=m.name, world=world, options=_options(rng, m, world),
                ranks_per_node=rng.choice([r for r in (1, 2, 4, 8) if world % r == 0]),
                seq_len=world * 1024 * rng.choice([1, 2, 4, 8, 32]),
                workload=rng.choice(["attention", "train_step"]))
    if cell["workload"] == "attention":
        heads = rng.choice([8, 32, 40, 64])
        cell.update(heads=heads, kv_heads=rng.choice(_divisors(heads)),
                    head_dim=rng.choice([64, 128]), causal=rng.random() < 0.8)
    else:
        cell.update(model=rng.choice(["7b", "14b", "tiny"]),
                    checkpointing=rng.choice(["none", "full", "selective", "selective_half"]),
                    fused_head=rng.random() < 0.5)
    if rng.random() < 0.2:
        cell["window"] = (rng.choice([1024, 4096]), 0)
    return cell


def test_random_cells_are_priced_or_refused_and_grow_with_the_sequence():
    from suites.hardware import load
    from suites.simulate import predict

    rng = random.Random(SEED)
    profiles = [load(name) for name in ("a800", "a100", "h100", "h200")]
    seen, failures = set(), []
    for _ in range(SIM_CELLS):
        cell, hw = draw_cell(rng), rng.choice(profiles)
        one, two = predict(cell, hw), predict(dict(cell, seq_len=2 * cell["seq_len"]), hw)
        seen.add(one.status)
        where = f"{hw.name} {cell}"
        if one.status != "ok" and not one.error:
            failures.append(f"{one.status} without a reason: {where}")
        if one.status == "oom" and two.status == "ok":
            failures.append(f"oom at seq_len, fits at twice it: {where}")
        if one.status == two.status == "ok":
            if two.memory.reserved_gib < one.memory.reserved_gib:
                failures.append(f"memory {one.memory.reserved_gib:.3f} -> "
                                f"{two.memory.reserved_gib:.3f} GiB at twice the sequence: "
                                f"{where}")
            if "window" not in cell and two.time_s < one.time_s:
                failures.append(f"time {one.time_s:.4g} -> {two.time_s:.4g} s at twice the "
                                f"sequence: {where}")
    assert seen == {"ok", "oom", "error"}, seen
    assert not failures, "\n".join(failures[:20])


EMULATED = 120  # about 3 s


def test_random_emulated_rings_equal_the_reference():
    from burst.emulate import emulate_attn
    from burst.reference import reference_attention

    rng = random.Random(SEED)
    failures = []
    for i in range(EMULATED):
        world = rng.choice([1, 2, 3, 4, 5, 6, 8, 12, 16])
        layout = rng.choice(["contiguous", "zigzag", "striped"])
        n = world * (rng.choice([2, 4, 6]) if layout == "zigzag" else rng.randint(1, 5))
        heads = rng.choice([1, 2, 4, 6])
        causal = rng.random() < 0.7
        mask = dict(causal=causal, window=None, cu_seqlens=None)
        if rng.random() < 0.4:
            mask["window"] = _window(rng, n, causal)
        if n > 1 and rng.random() < 0.4:
            mask["cu_seqlens"] = _documents(rng, n, most=4)
        opts = dict(layout=layout, ranks_per_node=rng.choice([None, *_divisors(world)]),
                    backward=rng.choice(["burst", "ring"]))
        g = torch.Generator().manual_seed(i)
        kv = rng.choice(_divisors(heads))
        q, k, v = (torch.randn(1, n, h, 8, generator=g, dtype=torch.float64, requires_grad=True)
                   for h in (heads, kv, kv))
        do = torch.randn(1, n, heads, 8, generator=g, dtype=torch.float64)
        out = emulate_attn(q, k, v, world=world, **mask, **opts)
        got = [out.detach(), *torch.autograd.grad(out, (q, k, v), do)]
        ref = reference_attention(q, k, v, **mask)[0]
        want = [ref.detach(), *torch.autograd.grad(ref, (q, k, v), do)]
        err = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        if not err < 1e-12:
            failures.append(f"world {world} {opts} {mask} H={heads}/{kv}: error {err:.3g}")
    assert not failures, "\n".join(failures[:20])
