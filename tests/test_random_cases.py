"""Random parity cases: methods x options x masks x shapes that no one picked by hand.

The hand-picked cases of ``tests/test_baselines.py`` run at world sizes 2, 4 and 8; these draw
every CPU core method with random options (layout, backward scheme, ranks per node, Ulysses
degree, gradient accumulator), mask (causal or not, a sliding window, documents, both), heads
and kv heads, batch and shard length, at world sizes 3 and 6 (odd rings, a double ring of
nodes of 3). Each valid case must equal the float64 reference (out, dq/dk/dv; burst's lse too)
and send the bytes of its formula; each combination ``Method.check`` refuses must raise a
ValueError before sending a byte. The draws are seeded, so a failure names a case that
reproduces: ``python -m pytest tests/test_random_cases.py``.

Before it was kept, the same generator drew 750 valid cases at world sizes 2, 3, 4, 6 and 8
and 300 refused ones: no failure.
"""

from __future__ import annotations

import random

import pytest

from baselines import registry
from burst.spawn import spawn
from tests.parity import case, check, run_cases
from tests.test_baselines import F32_TOL, _expected

CASES = 36  # per world and kind (valid, refused): about 10 s on this machine for both worlds


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def draw(rng: random.Random, world: int) -> dict:
    """One random case (any method, valid or not); ``expect_error`` is set by ``draws``."""
    m = registry.get(rng.choice(registry.names(available_only=True, level="core")))
    accepted = registry.accepted_options(m.fn) or set()
    opts = {"layout": rng.choice(m.layouts)}
    if "backward" in accepted:
        opts["backward"] = rng.choice(["burst", "ring", "auto"])
    if "ranks_per_node" in accepted and rng.random() < 0.7:
        opts["ranks_per_node"] = rng.choice(_divisors(world))
    if "ulysses_degree" in accepted:
        opts["ulysses_degree"] = rng.choice(_divisors(world))
    if "grad_acc" in accepted and rng.random() < 0.3:
        opts["grad_acc"] = rng.choice(["fp32", "input"])
    causal = m.causal_only or rng.random() < 0.7
    heads = rng.choice([1, 2, 3, 4, 6, 8, 12])
    seq_local = rng.choice([2, 4, 6, 8, 10, 12])
    n = seq_local * world
    window = docs = None
    if rng.random() < 0.35:
        window = (rng.randint(0, n), 0 if causal and rng.random() < 0.8 else rng.randint(0, n))
    if rng.random() < 0.35:
        docs = (0, *sorted(rng.sample(range(1, n), rng.randint(1, min(5, n - 1)))), n)
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


def draws(world: int, n: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``n`` valid and ``n`` refused cases (refused: ``expect_error`` "", any ValueError)."""
    rng = random.Random(seed * 1000 + world)
    valid, refused = [], []
    while len(valid) < n or len(refused) < n:
        c = draw(rng, world)
        c["seed"] = len(valid) + len(refused)
        if _refusal(c, world) is None:
            if len(valid) < n:
                valid.append(c)
        elif len(refused) < n:
            refused.append(dict(c, expect_error=""))
    return valid, refused


@pytest.mark.parametrize("world", [3, 6])
def test_random_cases_equal_the_reference_and_their_formula(world):
    valid, refused = draws(world, CASES)
    # the draws reach what they claim to: every method, every mask kind, non-causal calls
    assert {c["method"] for c in valid} == set(registry.names(available_only=True, level="core"))
    kinds = {(c["window"] is not None, c["cu_seqlens"] is not None) for c in valid}
    assert kinds == {(False, False), (True, False), (False, True), (True, True)}, kinds
    assert any(not c["causal"] for c in valid)
    cases = valid + refused
    per_rank = spawn(run_cases, world, args=(cases,), timeout_s=300)
    failures = check(cases, per_rank, world, _expected, F32_TOL)
    assert not failures, "\n".join(failures[:20])
