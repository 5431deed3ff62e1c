"""The simulator (issue 6): calibration against the paper, OOM as OOM, each option moving the
prediction the way the schedule says, and bytes per rank equal to the byte counter's.

The calibration is evaluated with the constants shipped in suites/hardware/a800.toml and
suites/implementations.toml (``python -m suites.calibrate`` fits them; here nothing is fitted).
Thresholds are the targets of issue 6 where the model meets them, and the honest numbers it
reaches where it does not (docs/simulator.md explains the misses).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from burst import comm
from burst.flops import peak_tflops
from burst.layout import shard
from burst.spawn import spawn
from burst.volume import method_bytes
from suites import calibrate
from suites.hardware import load
from suites.implementations import OURS, implementations
from suites.schedule import AttnShape, Topo, attention_timing, collective_seconds
from suites.simulate import as_cell, explain, predict, simulate_cell

HW = load("a800")
# this project's attention and checkpointing in an engine that shards its model states over
# every rank (ZeRO-3, as BurstEngine does); this project's own engine keeps them whole
# (Implementation.sharded_states), which at 7B-14B fills the GPU before any activation
ZERO3 = dataclasses.replace(OURS, sharded_states=True)
# the paper's BurstEngine as a plain ZeRO-3 system: its optimizer state on the GPU (its runs
# offload it) and the named model's SwiGLU (its 7B config builds a GELU MLP)
ZERO3_ON_GPU = implementations()["burstengine"].with_values(optimizer_offload=False,
                                                            gelu_mlp_models=())
# rows no single efficiency per system explains (docs/simulator.md, "What the model misses")
KNOWN_MISSES = {("main", "14b", 32, "loongtrain_double_ring", "selective"),
                ("main", "14b", 32, "loongtrain_double_ring", "full")}
# published OOM cells the counted memory model puts under the usable memory (same page):
# LoongTrain without selective checkpointing, LoongTrain-Ring 14B/64 (InternEvo's 14B memory
# gap) and Megatron-CP's kernel cells at 512K and 1M (the published benchmark holds ~2 GB)
KNOWN_OOM_MISSES = {("7b", 32, "loongtrain_double_ring", "full"),
                    ("14b", 64, "loongtrain_usp", "full"),
                    ("14b", 64, "loongtrain_double_ring", "full"),
                    ("kernel", 32, "megatron_cp", "")}
# the paper's Megatron-DeepSpeed asserts heads % Ulysses degree == 0 (degree = GPUs)
CANNOT_RUN = {("7b", 64, "deepspeed_ulysses", "selective"),
              ("14b", 32, "deepspeed_ulysses", "selective"),
              ("14b", 64, "deepspeed_ulysses", "selective")}


@pytest.fixture(scope="module")
def evals():
    return calibrate.evaluate(HW, implementations())


# ---------------------------------------------------------------------------------------------
# Calibration


def test_calibration_targets(evals):
    s = calibrate.summary(evals)
    assert s["rows"] == 38  # every published number (14 kernel + 24 training rows)
    assert s["median_abs_error"] <= 0.10
    rest = [abs(e["rel_error"]) for e in evals if e["rel_error"] is not None and (
        e["table"], e["model"], e["world"], e["method"], e["checkpointing"]) not in KNOWN_MISSES]
    assert len(rest) == 36 and max(rest) <= 0.25
    assert s["max_abs_error"] <= 0.75  # the two known misses (LoongTrain-Ring 14B training)
    # nor does InternEvo's other 13B config explain them: its window is the whole ring, a
    # different schedule (the rows move), which still leaves both rows over 25%
    flat = calibrate.whole_window(HW, implementations())
    fitted = {e["label"]: e["rel_error"] for e in evals if e["method"] ==
              "loongtrain_double_ring" and e["model"] == "14b" and e["rel_error"] is not None}
    assert {f["label"] for f in flat} == set(fitted) and len(flat) == 2
    assert all(f["rel_error"] > 0.25 and f["rel_error"] != fitted[f["label"]] for f in flat)


def test_published_memory_within_15_percent(evals):
    """Every published memory_gb within 15% (InternEvo's 14B rows only with the paper's
    vocabulary of 120000: its repository config's 32000 leaves them 24-29% short), but
    BurstEngine's 14B rows: its runs hold 9-11 GiB more than the counted model, which follows
    their scripts (optimizer offloaded; docs/simulator.md, "What the model misses"). Those
    two are short, not over, and within 25%."""
    mem = {(e["method"], e["model"], e["world"]): e["mem_rel_error"] for e in evals
           if e["mem_rel_error"] is not None}
    short = {("burstengine", "14b", 32), ("burstengine", "14b", 64)}
    assert len(mem) == 9 and short <= set(mem)
    assert max(abs(v) for k, v in mem.items() if k not in short) <= 0.15
    assert all(-0.25 < mem[k] < -0.15 for k in short)


def test_published_oom_cells_predicted_oom(evals):
    oom = [e for e in evals if e["status_paper"] == "oom"]
    def key(e):
        return e["model"] or "kernel", e["world"], e["method"], e["checkpointing"]

    skipped = {key(e): e["why_sim"] for e in oom if e["status_sim"] == "skipped"}
    assert set(skipped) == CANNOT_RUN, skipped
    assert all("does not divide" in why and "heads" in why for why in skipped.values())
    missed = {key(e) for e in oom if e["status_sim"] not in ("oom", "skipped")}
    assert missed <= KNOWN_OOM_MISSES, missed - KNOWN_OOM_MISSES
    assert len(oom) - len(missed) - len(skipped) >= 9
    # every Megatron training cell: its distributed optimizer keeps weights and fp32 grads whole
    assert all(e["status_sim"] == "oom" for e in oom
               if e["method"] == "megatron_cp" and e["table"] == "main")
    # (its kernel cells hold ~1-3 GiB, as the paper's log says: the test below)
    # and nothing the paper ran is predicted to run out of memory
    assert not [e for e in evals if e["status_paper"] == "ok" and e["status_sim"] == "oom"]


def test_burstengine_wins_every_main_panel(evals):
    """The paper's claim survives simulation: Burst-Ring and Burst-USP beat every baseline with
    the same checkpointing in every panel of the main table."""
    for key in {(e["model"], e["world"]) for e in evals if e["table"] == "main"}:
        for ckpt in ("selective", "full"):
            rows = [e for e in evals if (e["model"], e["world"]) == key
                    and e["checkpointing"] == ckpt and e["simulated"]]
            ours = [e["simulated"] for e in rows if e["method"].startswith("burstengine")]
            base = [e["simulated"] for e in rows if not e["method"].startswith("burstengine")]
            if ours and base:
                assert min(ours) > max(base), (key, ckpt)
    ranks = calibrate.rankings(evals)
    assert sum(r["preserved"] for r in ranks) >= 5 and len(ranks) == 8


def test_doc_matches_shipped_constants(evals):
    """docs/simulator.md was regenerated with the constants the data files ship: its summary,
    every table computed from the shipped constants (per-row error, implied attention rates,
    attention-layer memory, ranking misses) and the systems with their sources."""
    from suites.simulator_doc import _impl_table, _misses, readme_rows

    doc = (calibrate.DOC).read_text()
    for line in calibrate.summary_lines(calibrate.summary(evals)):
        assert line in doc
    for table in (calibrate.error_table, calibrate.attention_rate_table,
                  calibrate.kernel_memory_table):
        for line in table(evals).splitlines():
            assert line in doc, line
    for line in _misses(evals, calibrate.whole_window(HW, implementations())):
        assert line in doc, line
    # the README's fit block (suites.simulator_doc.update_readme): summary and error table
    readme = (calibrate.DOC.parent.parent / "README.md").read_text()
    for line in [*calibrate.summary_lines(calibrate.summary(evals)),
                 *calibrate.error_table(readme_rows(evals)).splitlines()]:
        assert line in readme, line
    for line in _impl_table(implementations()):  # the systems and their sources, as shipped
        assert line in doc, line


# ---------------------------------------------------------------------------------------------
# Each option moves the prediction the way the schedule says

MHA = AttnShape(batch=1, seq_len=1 << 17, heads=40, kv_heads=40, head_dim=128)
TOPO = Topo(32, 8)


def _t(method, **opts):
    return attention_timing(HW, method, opts, MHA, TOPO)


def test_burst_backward_beats_ring_backward_for_mha_at_scale():
    burst = _t("burst", backward="burst", ranks_per_node=8)
    ring = _t("burst", backward="ring", ranks_per_node=8)
    # ~25% fewer bytes (DESIGN.md 3)
    assert burst.volume.sent("backward") < 0.8 * ring.volume.sent("backward")
    assert burst.backward_s < ring.backward_s
    assert burst.forward_s == pytest.approx(ring.forward_s)
    # with few kv heads the ring backward moves fewer bytes, and 'auto' follows the bytes
    gqa = dataclasses.replace(MHA, kv_heads=4)
    auto = attention_timing(HW, "burst", {"backward": "auto", "ranks_per_node": 8}, gqa, TOPO)
    assert auto.plan.backward == "ring"


def test_double_ring_beats_flat_ring_across_nodes():
    double, flat = _t("burst", ranks_per_node=8), _t("burst")
    assert double.total_s < 0.8 * flat.total_s
    # double_ring's inner ring is a node's unless its options say otherwise (a planning audit
    # found the registry's default inner ring of 2 priced: 2-3x slower on 128 H100s)
    cell = {"workload": "attention", "method": "double_ring", "seq_len": 1 << 18, "world": 128,
            "heads": 32, "head_dim": 128, "causal": True}
    node, two = (simulate_cell({**cell, "options": o}, HW) for o in ({}, {"ranks_per_node": 2}))
    eight = simulate_cell({**cell, "options": {"ranks_per_node": 8}}, HW)
    assert {**node, "date": None} == {**eight, "date": None}  # (made a second apart, maybe)
    assert node["time_s"] < 0.8 * two["time_s"], (node["time_s"], two["time_s"])
    # inside one node the two are the same ring
    one = Topo(8, 8)
    a = attention_timing(HW, "burst", {"ranks_per_node": 8}, MHA, one)
    b = attention_timing(HW, "burst", {}, MHA, one)
    assert a.total_s == pytest.approx(b.total_s)


def test_slower_kernels_hide_behind_transfers_only_where_steps_wait():
    """attention_efficiency scales kernel work, not transfers: a compute-bound layer takes
    twice as long at efficiency 0.5, a transfer-bound one (a flat ring over 4 nodes at 4K
    tokens per GPU) much less than twice."""
    def ratio(shape, method, opts):
        slow = attention_timing(HW, method, opts, shape, TOPO, efficiency=0.5)
        full = attention_timing(HW, method, opts, shape, TOPO)
        assert slow.volume.sent("forward") == full.volume.sent("forward")  # same transfers
        return slow.total_s / full.total_s

    big = dataclasses.replace(MHA, seq_len=1 << 20)
    assert ratio(big, "burst", {"ranks_per_node": 8}) == pytest.approx(2.0, rel=0.01)
    assert ratio(MHA, "zigzag_ring", {}) < 1.5


@pytest.mark.parametrize("method, opts, world, local", [
    ("ring", {}, 4, 4),
    ("zigzag_ring", {"grad_acc": "input"}, 4, 4),
    ("burst", {"backward": "burst"}, 4, 4),
    ("burst", {"backward": "ring"}, 2, 2),
    ("burst", {"backward": "burst"}, 16, 16),
    ("usp", {"ulysses_degree": 8}, 32, 8),  # LoongTrain-USP's kernel cells: a ring of 4
    ("usp", {"ulysses_degree": 8, "backward": "burst"}, 16, 8),
    ("usp", {"ulysses_degree": 8, "backward": "burst", "grad_acc": "input"}, 16, 8),
])
def test_a_flat_ring_bound_by_its_link_takes_its_bytes_over_the_bandwidth(method, opts, world,
                                                                           local):
    """With free compute and no latency, a flat ring's forward and backward last exactly as
    long as its link takes to carry what the rank sends: every hop (the backward's
    accumulators home included) goes one after another through the same link. Pricing the
    S+1 accumulator hops as S payload hops plus half a hop more overcharged a ring of 4 by a
    sixth of its backward."""
    hw = HW.with_values(peak_tflops=1e12, hbm_gbps=1e12, nvlink_latency_us=0.0,
                        nic_latency_us=0.0)
    topo = Topo(world, local)
    t = attention_timing(hw, method, opts, MHA, topo)
    if method == "usp":  # the ring across nodes, after the all-to-alls inside each node
        senders = opts["ulysses_degree"]
        a2a = method_bytes("ulysses", world=senders, batch=MHA.batch,
                           seq_local=MHA.seq_len // world, heads=MHA.heads,
                           kv_heads=MHA.kv_heads, head_dim=MHA.head_dim, elem=MHA.elem)
        for phase, s in (("forward", t.forward_s), ("backward", t.backward_s)):
            ring = t.volume.sent(phase) - a2a.sent(phase)
            assert s == pytest.approx(collective_seconds(hw, a2a.sent(phase), senders, topo)
                                      + ring / (hw.inter_gbps(senders) * 1e9), rel=1e-6)
        return
    for phase, s in (("forward", t.forward_s), ("backward", t.backward_s)):
        assert s == pytest.approx(t.volume.sent(phase) / (hw.nvlink_gbps * 1e9), rel=1e-6)


@pytest.mark.parametrize("method, opts, world, local", [
    ("burst", {"ranks_per_node": 4, "backward": "burst"}, 16, 4),
    ("burst", {"ranks_per_node": 4, "backward": "ring"}, 8, 4),
    ("double_ring", {"ranks_per_node": 8}, 32, 8),
    ("burst", {"ranks_per_node": 8, "grad_acc": "input"}, 32, 8),
])
def test_a_double_ring_bound_by_one_link_takes_its_bytes_over_that_links_bandwidth(
        method, opts, world, local):
    """The same for a double ring (burst.ring._double) with one of its links free: bound by
    NVLink it takes its inner hops' bytes over NVLink (each round's accumulators home
    included), bound by the NICs its outer hops' bytes over the NICs that the node's GPUs
    share (the last round's accumulators home included)."""
    base = dict(peak_tflops=1e12, hbm_gbps=1e12, nvlink_latency_us=0.0, nic_latency_us=0.0)
    topo = Topo(world, local)
    for link, free in (("intra", "nic_gbps"), ("inter", "nvlink_gbps")):
        hw = HW.with_values(**base, **{free: 1e15})
        t = attention_timing(hw, method, opts, MHA, topo)
        gbps = hw.nvlink_gbps if link == "intra" else hw.inter_gbps(local)
        for phase, s in (("forward", t.forward_s), ("backward", t.backward_s)):
            assert s == pytest.approx(t.volume.sent(phase, link) / (gbps * 1e9), rel=1e-6), (
                link, phase)


@pytest.mark.parametrize("method, opts, world, local", [
    ("burst", {"ranks_per_node": 4, "backward": "burst"}, 16, 2),
    ("burst", {"ranks_per_node": 4, "backward": "ring"}, 8, 1),
    ("double_ring", {"ranks_per_node": 8}, 32, 4),
])
def test_a_double_ring_whose_inner_ring_crosses_nodes_gets_one_nic_per_gpu(
        method, opts, world, local):
    """An inner ring longer than a node crosses a NIC at every step, from one GPU of each node,
    while the outer hop leaves the node too: with free compute, both go through that GPU's one
    NIC, so the ring takes all the bytes a rank sends over one NIC. Each hop was priced on a
    NIC of its own, twice the bandwidth a GPU gets (README: --gpus-per-node 4)."""
    hw = HW.with_values(peak_tflops=1e12, hbm_gbps=1e12, nvlink_gbps=1e15,
                        nvlink_latency_us=0.0, nic_latency_us=0.0)
    t = attention_timing(hw, method, opts, MHA, Topo(world, local))
    for phase, s in (("forward", t.forward_s), ("backward", t.backward_s)):
        for rank in range(opts["ranks_per_node"]):
            sent = t.rank_volume(rank).sent(phase)
            assert s == pytest.approx(sent / (hw.inter_gbps(1) * 1e9), rel=1e-6), (phase, rank)


@pytest.mark.parametrize("method, opts", [
    ("double_ring", {"ranks_per_node": 2}),
    ("burst", {"ranks_per_node": 2, "backward": "burst"}),
    ("burst", {"ranks_per_node": 4, "backward": "ring"}),
])
def test_a_double_ring_inside_one_node_shares_each_gpus_nvlink(method, opts):
    """A double ring whose rings both stay on one node sends its inner and its outer hops
    through each GPU's one NVLink: with free compute it takes the bytes a rank sends over
    NVLink's bandwidth, as a flat ring does. Each hop had its own full NVLink, so the double
    ring was priced 1.75x faster than its bytes allow (a helper's simulator audit)."""
    hw = HW.with_values(peak_tflops=1e12, hbm_gbps=1e12, nvlink_latency_us=0.0,
                        nic_latency_us=0.0)
    t = attention_timing(hw, method, opts, MHA, Topo(8, 8))
    for phase, s in (("forward", t.forward_s), ("backward", t.backward_s)):
        assert s == pytest.approx(t.volume.sent(phase) / (hw.nvlink_gbps * 1e9), rel=1e-6)
    flat = attention_timing(hw, "zigzag_ring", {}, MHA, Topo(8, 8))
    assert t.forward_s >= flat.forward_s * (1 - 1e-9)


def test_zigzag_balances_causal_work():
    zig, contiguous = _t("burst", layout="zigzag"), _t("burst", layout="contiguous")
    # the slowest rank's work: 16 of 31.5 blocks (0.51), in half-size calls that the kernel
    # runs less efficiently at 4K tokens per rank
    assert zig.compute_forward_s < 0.65 * contiguous.compute_forward_s


def test_ulysses_inside_a_node_moves_fewer_ring_bytes():
    usp = _t("usp", ulysses_degree=8, ring="burst", layout="zigzag")
    ring = _t("burst", ranks_per_node=8)
    # one all-to-all instead of 28 NVLink hops
    assert usp.volume.sent(link="intra") < ring.volume.sent(link="intra")
    # 4 ring steps of 8x longer blocks: the kernel runs at a better efficiency
    assert usp.compute_forward_s < ring.compute_forward_s


def _train(**kw):
    cell = dict(workload="train_step", method="burst", model="14b", seq_len=1 << 20, world=32,
                ranks_per_node=8, options={"ranks_per_node": 8}, checkpointing="selective",
                fused_head=True)
    cell.update(kw)
    return predict(as_cell(cell), HW, ZERO3)


def test_topology_comes_from_the_profile_or_is_an_error():
    """A cell with only ``world`` gets the profile's nodes (8 GPUs each on a800); a cell that
    puts more ranks on a node than the profile has GPUs is an error row, not one big node."""
    cell = dict(workload="attention", method="zigzag_ring", seq_len=1 << 17, world=32,
                heads=40, head_dim=128)
    assert predict(cell, HW).time_s == pytest.approx(
        predict({**cell, "ranks_per_node": 8}, HW).time_s)
    bad = predict({**cell, "nodes": 1}, HW)
    assert bad.status == "error" and "8 GPUs per node" in bad.error
    with pytest.raises(ValueError, match="does not split"):
        as_cell({**cell, "world": 12, "nodes": 5})
    # a spec's placeholders mean the same in a cell given as a dict
    dr = {**cell, "method": "double_ring", "ranks_per_node": 8}
    assert as_cell({**dr, "options": {"ranks_per_node": "@world/4"}}).options == {
        "ranks_per_node": 8}


def test_double_ring_pays_for_the_hops_that_leave_the_node():
    """Inner rings shorter than a node: the outer hop of a node's last inner ring crosses a
    NIC, and the lockstep ring waits for it (it was priced from rank 0, whose hop stays
    inside); ranks_per_node=1 is a flat ring (burst.comm.ring_shape), not a free double ring."""
    t = {rpn: _t("double_ring", ranks_per_node=rpn).total_s for rpn in (2, 4, 8)}
    assert t[2] > 1.5 * t[8] and t[2] > 1.5 * t[4]
    # inner rings of 4 and of 8 hide their outer hops alike; they differ only in the last
    # accumulator hop home, which 4 GPUs of a node make on a NIC each, 8 on half a NIC each
    assert t[8] > t[4] > 0.95 * t[8]
    flat, one = _t("burst"), _t("burst", ranks_per_node=1)
    assert one.plan.ring_local is None
    assert one.forward_s == pytest.approx(flat.forward_s)
    # windows that straddle node boundaries (6 of nodes of 8) cross a NIC inside the inner
    # ring: slower than windows of one node (they were priced as NVLink, and came out faster)
    shape, topo = dataclasses.replace(MHA, seq_len=24 * 4096), Topo(24, 8)
    six, eight = (attention_timing(HW, "double_ring", {"ranks_per_node": r}, shape, topo)
                  for r in (6, 8))
    assert six.total_s > 1.1 * eight.total_s


def test_windows_shrink_every_method_they_mask():
    """A sliding window cuts the kernel work of Ulysses, TP and all-gather (exact pairs) and
    the ring bytes of USP (truncated span, as burst.volume counts them)."""
    from burst import volume

    win = dataclasses.replace(MHA, window=(2048, 0))
    topo = Topo(8, 8)
    for m in ("ulysses", "tp", "allgather"):
        full = attention_timing(HW, m, {}, MHA, topo).total_s
        assert attention_timing(HW, m, {}, win, topo).total_s < 0.2 * full, m
    small = dataclasses.replace(win, seq_len=1 << 16)
    usp = attention_timing(HW, "usp", {"ulysses_degree": 2}, small, Topo(16, 8))
    plain = attention_timing(HW, "usp", {"ulysses_degree": 2},
                             dataclasses.replace(small, window=None), Topo(16, 8))
    assert usp.backward_s < plain.backward_s
    counted = volume.method_bytes("usp", world=16, batch=1, seq_local=(1 << 16) // 16,
                                  heads=40, kv_heads=40, head_dim=128, elem=2, acc_elem=4,
                                  ulysses_degree=2, layout="contiguous", node_size=8, causal=True,
                                  window=(2048, 0))
    assert usp.volume.sent("forward") == counted.sent("forward")


def _slowest_per_step(shape, layout, g, n, pass_, order, ranks=None):
    """Each step's time on its slowest rank (of ``ranks``, default every rank), each rank's
    pair at step s being its block ``order(rank)[s]``, found pair by pair."""
    from suites.schedule import _merge_seconds, _pair_seconds

    merge = _merge_seconds(HW, shape, n, shape.heads, shape.kv_heads, pass_)
    ranks = range(g) if ranks is None else ranks
    orders = {r: order(r) for r in ranks}
    out = []
    for s in range(g):
        worst = 0.0
        for r in ranks:
            t, any_call = _pair_seconds(HW, shape, layout, g, r, orders[r][s], n, shape.heads,
                                        pass_)
            worst = max(worst, t + (merge if any_call else 0.0))
        out.append(worst)
    return out


def test_a_windowed_ring_step_is_timed_on_its_slowest_rank():
    """Each ring step is bound by its slowest rank. Without a window or documents the first,
    middle and last ranks bound it; with a window on the zigzag layout the ranks near the
    middle of the second half carry up to 2x their work at later steps, which the sample
    missed (a 1M-token cell on 32 GPUs came out 28% too fast: a simulator audit). Every
    step's time is the maximum over every rank, found here pair by pair."""
    from burst.ring import visit_order
    from suites.schedule import _ranks_bounding, step_compute

    g, n = 16, 1 << 10
    shape = AttnShape(batch=1, seq_len=g * n, heads=8, kv_heads=8, head_dim=64,
                      window=(g * n // 4, 0))
    brute, sampled = (_slowest_per_step(shape, "zigzag", g, n, "forward",
                                        lambda r: visit_order(g, r), ranks)
                      for ranks in (None, (0, g // 2, g - 1)))
    assert step_compute(HW, shape, "zigzag", g, n, 8, 8, "forward") == brute
    assert sum(brute) > 1.1 * sum(sampled)  # the case the three-rank sample misses
    # unwindowed, the sample stands
    assert _ranks_bounding(g, dataclasses.replace(shape, window=None).mask) == [0, 8, 15]


def test_a_double_rings_steps_are_timed_on_the_blocks_it_visits():
    """A double ring's rank (n, l) works at step m L + i on the block of rank (n - m, l - i)
    (burst.ring.visit_order), not on that of r - s as a flat ring does: for l < i that is a
    block of another node. Each step's time is the maximum over every rank of its pair in
    that order. A review found the flat order priced for the double ring: with a window on
    the contiguous layout it put every rank's work into the same steps, 1.3-1.9x too fast."""
    from burst.ring import visit_order
    from suites.schedule import step_compute

    g, nodes, n = 16, 4, 1 << 10
    for layout, window in (("contiguous", (5000, 0)), ("contiguous", (3000, 2000)),
                           ("zigzag", (5000, 0))):
        shape = AttnShape(batch=1, seq_len=g * n, heads=8, kv_heads=8, head_dim=64,
                          causal=window[1] == 0, window=window)
        for pass_ in ("forward", "backward"):
            real = _slowest_per_step(shape, layout, g, n, pass_,
                                     lambda r: visit_order(g, r, nodes=nodes))
            assert step_compute(HW, shape, layout, g, n, 8, 8, pass_, nodes=nodes) == real
            if layout == "contiguous":  # the flat order: well under the real steps
                flat = _slowest_per_step(shape, layout, g, n, pass_, lambda r: visit_order(g, r))
                assert sum(real) > 1.2 * sum(flat), (window, pass_)


def test_a_windowed_ring_is_priced_once_per_geometry_as_rank_by_rank(monkeypatch):
    """With a window every rank is priced at every step, but ranks whose pairs have the same
    geometry (``burst.masks.pair_geometry``: the same offsets between their position runs)
    have the same calls, so each geometry is priced once: the times equal those of pricing
    every rank on its own, to the last bit, on every layout, for causal and two-sided windows,
    one-way and two-way rings, flat and double, and the all-gather's sum over every block. It
    prices far fewer pairs. (Rank by rank, a 1024-GPU windowed Ministral spec took 52 s, now
    5 s; a 4096-GPU one 40 s, now 16 s; a 1024-GPU windowed all-gather layer 64 s, now 2 s.)"""
    import suites.schedule as schedule
    from burst import masks
    from burst.masks import MaskSpec, ring_reach

    windows = [(True, (5000, 0)), (True, (3 * 1024, 0)), (False, (2 * 1024, 1024)),
               (False, (1024, 3 * 1024 + 7)), (False, (7 * 1024, 1))]
    methods = [("burst", {"layout": "contiguous", "backward": "burst"}),
               ("burst", {"layout": "contiguous", "backward": "ring"}), ("ring", {}),
               ("burst", {"layout": "zigzag"}), ("striped_ring", {}),
               ("burst", {"layout": "zigzag", "ranks_per_node": 4}),
               ("allgather", {"layout": "zigzag"}), ("allgather", {"layout": "contiguous"})]
    priced = {"geometry": 0, "rank": 0}
    real = schedule._pair_seconds
    two_way = 0
    for g, (causal, window), (method, opts) in itertools.product((8, 16), windows, methods):
        shape = AttnShape(batch=1, seq_len=g * 1024, heads=4, kv_heads=2, head_dim=64,
                          causal=causal, window=window)
        two_way += ring_reach(shape.mask, opts.get("layout", "contiguous"), g, 1024)[1] > 0
        timings = {}
        for how in priced:
            with monkeypatch.context() as m:
                def counting(*args, how=how):
                    priced[how] += 1
                    return real(*args)
                m.setattr(schedule, "_pair_seconds", counting)
                if how == "rank":  # no geometry, no skipping: each pair planned on its own
                    m.setattr(schedule, "pair_geometry",  # a pair's "geometry": its ranks
                              lambda mask, layout, g, q, k, n: np.stack([q, k], axis=-1))
                    m.setattr(schedule, "pair_empty",
                              lambda mask, layout, g, q, k, n: np.zeros(np.shape(k), bool))
                    m.setattr(masks, "pair_geometry", lambda *args: None)
                    m.setattr(masks, "_PLANS", masks._PlanCache(256 << 20))
                    for cache in (schedule._pair_calls, schedule._one_way_work,
                                  schedule._two_way_work):
                        cache.cache_clear()
                t = attention_timing(HW, method, opts, shape, Topo(g, 4 if g == 16 else g))
            for cache in (schedule._pair_calls, schedule._one_way_work, schedule._two_way_work):
                cache.cache_clear()
            timings[how] = (t.forward_s, t.backward_s)
        assert timings["geometry"] == timings["rank"], (g, causal, window, method, opts)
    assert two_way >= 15
    assert priced["rank"] > 2 * priced["geometry"]  # more, the more ranks
    assert schedule._ranks_bounding(16, MaskSpec(causal=True, window=(9, 0))) == list(range(16))
    assert schedule._ranks_bounding(16, MaskSpec(causal=True)) == [0, 8, 15]


def test_which_ranks_a_step_prices_is_worked_out_once_per_ring_not_per_profile(monkeypatch):
    """A fit prices the same cells hundreds of times with other constants; which ranks each
    ring step prices (one per geometry of work) depends on the ring alone. Worked out at every
    evaluation, it took 85% of ``calibrate.fit`` (169 s; 18 s kept per ring): pricing a cell
    again, on another profile, finds no geometry, and gives that profile's own times."""
    import suites.schedule as schedule

    geometries = []
    real = schedule.pair_geometry
    monkeypatch.setattr(schedule, "pair_geometry",
                        lambda *args: geometries.append(1) or real(*args))
    for cache in (schedule._one_way_work, schedule._two_way_work):
        cache.cache_clear()
    shape = AttnShape(batch=1, seq_len=16 * 1024, heads=4, kv_heads=4, head_dim=64,
                      causal=True, window=(3 * 1024, 0))
    cells = [("burst", {"layout": "zigzag"}, Topo(16, 16)),  # two-way, windowed
             ("burst", {"layout": "contiguous", "ranks_per_node": 4}, Topo(16, 4)),  # double
             ("ring", {}, Topo(16, 16))]
    a800 = [attention_timing(HW, m, o, shape, t) for m, o, t in cells]
    assert geometries
    geometries.clear()
    h100 = [attention_timing(load("h100"), m, o, shape, t) for m, o, t in cells]
    assert not geometries
    assert all(a.forward_s > b.forward_s and a.backward_s > b.backward_s
               for a, b in zip(a800, h100, strict=True))


def test_a_cell_takes_numpy_counts_and_refuses_what_the_core_refuses():
    """Found by a simulator fuzz: ranks_per_node=np.int64(2) was priced as an error row
    ("2 does not divide world=8"), any numpy value failed in the cell id; a window given as a
    set was priced with its sides in hash order (the core refuses it); options given as a list
    or a string, a torch dtype and a hardware that is no name were Python errors."""
    import numpy as np

    base = dict(workload="attention", method="burst", seq_len=1 << 14, world=8, heads=8,
                head_dim=64)
    plain = simulate_cell({**base, "options": {"ranks_per_node": 2}, "window": (300, 0)}, HW)
    numpy = simulate_cell({**base, "world": np.int64(8), "window": (np.int64(300), 0),
                           "options": {"ranks_per_node": np.int64(2)}}, HW)
    assert numpy["status"] == plain["status"] == "ok"
    assert numpy["time_s"] == plain["time_s"] and numpy["cell_id"] == plain["cell_id"]
    for bad, match in ((dict(window={300, 5}), "window=.*expected \\(left, right\\)"),
                       (dict(window=5), "window=5: expected"),
                       (dict(options=[("layout", "zigzag")]), "expected a table of option"),
                       (dict(options="layout=zigzag"), "expected a table of option"),
                       (dict(dtype=torch.bfloat16), "dtype=torch.bfloat16 \\(expected a name")):
        with pytest.raises(ValueError, match=match):
            simulate_cell({**base, **bad}, HW)
    with pytest.raises(ValueError, match="hardware=5 is not a profile's name or path"):
        simulate_cell(base, 5)


def test_a_windowed_cell_plans_each_pair_once_for_both_passes(monkeypatch):
    """A windowed cell prices every (query rank, key rank) pair in forward and in backward. At
    G = 64 that is 4096 pairs, more than ``burst.masks``' plan cache keeps, so each pass
    re-planned them all (a 1M-token cell took 30 s). The simulator keeps each pair's call
    summary: at most one plan per pair (one per geometry), whatever the cache holds."""
    from burst import masks
    from suites import schedule
    from suites.schedule import step_compute

    planned = []

    def counting(*args):
        planned.append(args[2:5])
        return masks.plan_pair(*args)

    monkeypatch.setattr(schedule, "plan_pair", counting)
    monkeypatch.setattr(masks, "_PLANS", masks._PlanCache(budget=0, entries=1))  # no reuse there
    schedule._pair_calls.cache_clear()
    g, n = 8, 256
    shape = AttnShape(batch=1, seq_len=g * n, heads=4, kv_heads=4, head_dim=32,
                      window=(g * n // 3, 0))
    fwd = step_compute(HW, shape, "striped", g, n, 4, 4, "forward")
    bwd = step_compute(HW, shape, "striped", g, n, 4, 4, "backward")
    assert len(planned) == len(set(planned)) < g * g  # pairs of one geometry: one plan
    assert all(b > f for f, b in zip(fwd, bwd, strict=True))  # the backward's own pricing
    schedule._pair_calls.cache_clear()


def test_an_all_to_all_group_across_a_node_boundary_crosses_the_nics():
    """USP's Ulysses groups of U consecutive ranks stay inside a node when U divides the node;
    on nodes of 6, groups of 4 (ranks 4-7) straddle two, and half of those members' shares
    cross the NICs. They were priced as NVLink alike (the row's own inter-node bytes said
    otherwise: a simulator audit)."""
    nbytes = 3 * (64 << 20)
    aligned = collective_seconds(HW, nbytes, 4, Topo(12, 4))
    straddling = collective_seconds(HW, nbytes, 4, Topo(12, 6))
    assert aligned == collective_seconds(HW, nbytes, 4, Topo(8, 8))  # all NVLink
    # rank 4 (node 0) sends 2 of its 3 shares to ranks 6, 7 (node 1); ranks 4, 5 cross at once
    two_of_three = 2 * (64 << 20) / (HW.inter_gbps(2) * 1e9) + HW.nic_latency_us * 1e-6
    assert straddling == pytest.approx(two_of_three + 3 * 1e-6 * HW.nic_latency_us / 4)
    assert straddling > 3 * aligned
    shape = dataclasses.replace(MHA, seq_len=12 * 8192, heads=32, kv_heads=32)
    t = [attention_timing(HW, "usp", {"ulysses_degree": 4, "layout": "zigzag"}, shape,
                          Topo(12, local)).forward_s for local in (4, 6)]
    assert t[1] > t[0]


def test_allgather_times_the_busiest_rank():
    """Every rank's queries meet the whole sequence: causal on the contiguous layout leaves the
    last rank (2G-1)/G of the average work (1.875 at G=8); zigzag balances it."""
    topo = Topo(8, 8)
    z = attention_timing(HW, "allgather", {"layout": "zigzag"}, MHA, topo).compute_forward_s
    c = attention_timing(HW, "allgather", {"layout": "contiguous"}, MHA, topo).compute_forward_s
    assert c / z == pytest.approx(1.875, rel=0.06)


def test_allgather_across_nodes_is_priced_as_gather_and_reduce_scatter():
    """The all-gather method's K/V gather and dK/dV reduce-scatter cross the NICs as NCCL's ring
    collectives, not as all-to-alls (priced as one, 16 GPUs on 2 nodes took 67% longer in
    forward: a mutation audit)."""
    topo = Topo(16, 8)
    t = attention_timing(HW, "allgather", {"layout": "zigzag"}, MHA, topo)
    for pass_, total, compute in (("forward", t.forward_s, t.compute_forward_s),
                                  ("backward", t.backward_s, t.compute_backward_s)):
        sent = t.rank_volume(0).sent(pass_)
        gather = collective_seconds(HW, sent, 16, topo, "gather")
        assert gather != collective_seconds(HW, sent, 16, topo, "all_to_all")
        assert total - compute == pytest.approx(gather, rel=1e-9)


def test_zero3_backward_waits_for_the_gradient_reduce_scatter():
    """Short sequences leave a ZeRO-3 layer bound by its collectives: the forward by the weight
    gather, the backward by the gather and the gradient reduce-scatter of the same bytes, twice
    as long (the reduce-scatter left out took 21% off a 7B step at 8K tokens: a mutation
    audit); twice the tokens change neither."""
    cell = dict(workload="train_step", method="burst", paper="burstengine", model="7b",
                seq_len=1 << 13, world=32, ranks_per_node=8, checkpointing="selective",
                options={"ranks_per_node": 8})
    short, longer = (predict(as_cell(dict(cell, seq_len=n)), HW) for n in (1 << 13, 1 << 14))
    assert short.parts["layers_backward"] == pytest.approx(2 * short.parts["layers_forward"])
    for part in ("layers_forward", "layers_backward"):
        assert longer.parts[part] == pytest.approx(short.parts[part])


def test_a_step_whose_every_pair_is_masked_costs_nothing():
    """A window shorter than a rank's block leaves each rank its own block and its left
    neighbour's: the later steps plan no kernel call and pay no merge either (a merge charged
    there took 3.9% onto a windowed double ring's forward: a mutation audit)."""
    from suites.schedule import step_compute

    shape = dataclasses.replace(MHA, seq_len=1 << 14, window=(256, 0))
    for pass_ in ("forward", "backward"):
        steps = step_compute(HW, shape, "contiguous", 8, (1 << 14) // 8, 40, 40, pass_)
        assert steps[0] > 0 and steps[1] > 0
        assert steps[2:] == [0.0] * 6


def test_windowed_cells_at_1m_tokens_need_no_dense_masks(monkeypatch):
    """The cost model plans a windowed ring from key bounds: no (n, n) mask is built for a
    1M-token cell (a dense mask of its 131072-token blocks would be 16 GiB)."""
    import torch

    made = []
    real = torch.ones

    def watched(*size, **kw):
        made.append(size)
        return real(*size, **kw)

    monkeypatch.setattr(torch, "ones", watched)
    big = dataclasses.replace(MHA, seq_len=1 << 20, window=(4096, 0))
    assert attention_timing(HW, "burst", {"layout": "zigzag"}, big, Topo(8, 8)).total_s > 0
    assert not [s for s in made if len(s) >= 2 and max(s) > 4096]


def test_half_selective_is_full_recomputation_where_selective_caches_no_attention():
    """A system whose 'selective' checkpointing keeps no attention output (Megatron's,
    DeepSpeed's) has no half of that cache either: its 'selective_half' is priced as full
    recomputation, as its 'selective' is (it was priced with half a cache it does not have,
    faster than its own 'selective': a simulator audit)."""
    base = dict(workload="train_step", method="striped_ring", model="7b", seq_len=1 << 20,
                world=32, ranks_per_node=8, paper="megatron_cp")
    rows = {c: simulate_cell({**base, "checkpointing": c}, HW)
            for c in ("selective", "selective_half", "full")}
    for k in ("time_s", "mem_reserved_bytes", "tflops_hardware_flops"):
        assert rows["selective_half"][k] == pytest.approx(rows["full"][k]), k
        assert rows["selective"][k] == pytest.approx(rows["full"][k]), k
    ours = {c: simulate_cell({**base, "paper": "burstengine", "method": "burst",
                              "options": {"layout": "striped"}, "checkpointing": c}, HW)
            for c in ("selective", "selective_half", "full")}
    assert ours["selective"]["time_s"] < ours["selective_half"]["time_s"] < \
        ours["full"]["time_s"]


def test_rows_count_what_the_system_really_ran():
    """DeepSpeed's "selective" caches no attention, so it is priced as full recomputation: its
    row reports full's FLOPs and the forward's bytes twice; intra + inter bytes = forward +
    backward bytes."""
    base = dict(workload="train_step", method="ulysses", model="7b", seq_len=1 << 21,
                world=32, ranks_per_node=8, paper="deepspeed_ulysses")
    sel = simulate_cell({**base, "checkpointing": "selective"}, HW)
    full = simulate_cell({**base, "checkpointing": "full"}, HW)
    for k in ("time_s", "tflops_hardware_flops", "bytes_sent_forward", "bytes_sent_inter"):
        assert sel[k] == pytest.approx(full[k]), k
    for r in (sel, full):
        assert r["bytes_sent_intra"] + r["bytes_sent_inter"] == \
            r["bytes_sent_forward"] + r["bytes_sent_backward"]


def test_no_checkpointing_counts_each_activation_once():
    """Without checkpointing every activation is already kept: the last layer's backward adds
    only its gradients and buffers, not a recomputed copy."""
    from burst.engine.configs import get_config
    from suites.memory_model import layer_activation_bytes

    cell = dict(workload="train_step", method="burst", model="7b", seq_len=1 << 16, world=8,
                ranks_per_node=8)
    none = predict({**cell, "checkpointing": "none"}, HW, ZERO3).memory
    full = predict({**cell, "checkpointing": "full"}, HW, ZERO3).memory.parts
    act = sum(layer_activation_bytes(get_config("7b"), (1 << 16) // 8).values())
    # the layer moment of "none": its kept activations + the last layer's gradients and
    # buffers (full's layer_backward minus its recomputed activations); a second copy of the
    # activations would have made it the peak here
    layer = (none.parts["model_states"] + none.parts["checkpoints"]
             + full["gathered_params"] + full["layer_backward"] - act)
    assert set(none.parts) == {"model_states", "checkpoints", "implementation", "head"}
    assert layer < none.allocated < layer + act


def test_checkpointing_modes_trade_time_for_memory():
    sel, half, full = (_train(checkpointing="selective"),
                       _train(checkpointing="selective_half",
                              options={"ranks_per_node": 8, "layout": "striped"}),
                       _train(checkpointing="full"))
    assert sel.time_s < half.time_s < full.time_s
    assert full.memory.allocated < half.memory.allocated < sel.memory.allocated
    # no checkpointing keeps every activation of every layer: out of memory at 1M on 32 GPUs
    assert _train(checkpointing="none").status == "oom"


def test_fused_head_saves_memory_not_time():
    # 16K tokens per GPU: the plain head's 12 bytes per logit (OURS.logits_bytes) of a 120K
    # vocabulary fit beside the rest (at 32K they take 44 GiB: out of memory)
    fused, plain = (_train(fused_head=f, seq_len=1 << 19) for f in (True, False))
    assert plain.status == "ok" and _train(fused_head=False).status == "oom"
    assert fused.memory.parts.get("head", 0) < plain.memory.parts.get("head", 1)
    assert fused.memory.allocated <= plain.memory.allocated
    assert fused.time_s == pytest.approx(plain.time_s, rel=0.01)
    # where the head is the peak (14B, vocab 120K, plain head) the fused one is far leaner
    big = dict(seq_len=1 << 21, world=32)
    assert _train(fused_head=True, **big).memory.reserved < \
        0.8 * _train(fused_head=False, **big).memory.reserved


def test_zero_offload_moves_optimizer_state_off_the_gpu():
    cell = as_cell(dict(workload="train_step", method="burst", model="7b", seq_len=32768,
                        world=1, checkpointing="selective", fused_head=True))
    on_gpu, offloaded = predict(cell, HW, ZERO3), predict(cell, HW, ZERO3, offload=True)
    assert on_gpu.status == "oom"  # 16 bytes per parameter of 6.7B on one 80 GiB GPU
    assert offloaded.status == "ok" and offloaded.memory.reserved < 0.5 * on_gpu.memory.reserved


def test_this_projects_engine_is_priced_with_its_states_whole():
    """A cell of this project's engine (no paper system) holds weights, gradients and AdamW
    moments whole in the model's dtype on every rank (burst.engine.Trainer: no ZeRO-3 across
    the context-parallel group), by moment: weights and moments through the forward (the
    gradients are None until the backward makes them), all four at the optimizer step with
    foreach AdamW's sqrt(v); it sums its gradients with all-reduces after the backward, steps
    the optimizer on every parameter and cannot offload. The same cell priced with ZeRO-3
    shards all of it."""
    from burst.engine.configs import get_config, param_count
    from suites.memory_model import engine_bytes_per_param, head_bytes

    cfg = get_config("7b")
    cell = as_cell(dict(workload="train_step", method="burst", model="7b", seq_len=1 << 15,
                        world=8, ranks_per_node=8, checkpointing="full", fused_head=True))
    params = param_count(cfg)
    ours, zero = predict(cell, HW), predict(cell, HW, ZERO3)
    assert zero.memory.parts["model_states"] == 16 * params / 8
    # 4K tokens per rank: the optimizer step is the peak, 8 bytes of states + 2 of sqrt(v)
    assert engine_bytes_per_param(2) == 8
    assert ours.memory.parts == {"model_states": 8 * params, "optimizer_step": 2 * params}
    # 256K tokens per rank: a moment of the backward, with 6 bytes of weights and moments
    long = predict(dataclasses.replace(cell, seq_len=1 << 21), HW).memory.parts
    assert long["model_states"] == 6 * params and "gathered_params" not in long
    # the head holds its weight's gradient only (its weight is among the states)
    assert head_bytes(cfg, 4096, True, elem=2, weight_copies=1) == \
        head_bytes(cfg, 4096, True, elem=2) - cfg.vocab_size * cfg.hidden_size * 2
    # all-reduces (= reduce-scatter + all-gather) of the bf16 gradients, not overlapped,
    # against ZeRO-3's per-layer gathers and reduce-scatters hidden behind compute
    ar = 2 * collective_seconds(HW, params * 2 * 7 / 8, 8, Topo(8, 8), "gather")
    assert ours.parts["state_collectives"] == pytest.approx(ar)
    assert ours.parts["optimizer"] == pytest.approx(8 * zero.parts["optimizer"] / 2)
    assert ours.time_s > zero.time_s
    assert predict(cell, HW, offload=True).error.startswith("offload: this project's engine")
    # on one rank there is nothing to sum
    one = predict(dataclasses.replace(cell, world=1, nodes=1, ranks_per_node=1,
                                      seq_len=1 << 12), HW)
    assert one.parts["state_collectives"] == 0


def test_the_ablation_is_the_paper_systems():
    """paper_ablation prices BurstEngine as the paper ran it (ZeRO-3), step by step; this
    project's engine, which keeps a 14B model's states whole, runs out of memory there."""
    from suites.cells import expand
    from suites.spec import load_spec

    cells = expand(load_spec("paper_ablation"))
    assert {c.paper for c in cells} == {"burstengine"}
    assert all(predict(c, HW).status == "ok" for c in cells)
    assert all(predict(c, HW, OURS).status == "oom" for c in cells)


def test_engine_flag_prices_the_paper_specs_as_this_engine_runs_them(capsys):
    """`simulate --engine`: every cell as this project's engine runs it (what `burst-bench run`
    measures), the paper's systems' cells too: at the paper's scale they run out of memory
    where the paper's systems fit (its states whole, 8 bytes per parameter; BurstEngine's cells
    without selective checkpointing were the last to fit, until burst.ring's buffers were
    counted as it holds them). A spec with no paper system is priced the same."""
    from suites.simulate import main, simulate_spec
    from suites.spec import load_spec

    spec = load_spec("paper_main_7b")
    paper, ours = simulate_spec(spec, HW), simulate_spec(spec.as_this_engine(), HW)
    assert sum(r["status"] == "ok" for r in paper) == 13  # 12 published numbers + one miss
    # none fits (the closest: Burst-USP w/o sele-ckpt, 79.4 GiB reserved of 78.5); Ulysses
    # cannot split its 32 heads over 64 ranks
    assert sum(r["status"] == "oom" for r in ours) == 19
    assert [r["label"] for r in ours if r["status"] != "oom"] == ["Deepspeed-Ulysses"]
    assert {r["sweep"] for r in ours} == {"paper_main_7b-engine"} and not any(
        r.get("paper") for r in ours)
    assert [r["label"] for r in ours] == [r["label"] for r in paper]
    mine = load_spec("engine_7b")
    keep = ("status", "time_s", "mem_reserved_bytes", "bytes_sent_forward")
    assert [{k: r[k] for k in keep} for r in simulate_spec(mine.as_this_engine(), HW)] == \
        [{k: r[k] for k in keep} for r in simulate_spec(mine, HW)]
    assert main(["paper_main_7b", "--engine"]) == 0
    out = capsys.readouterr().out
    assert out.count("tokens/s") == 0 and out.count("oom: predicted OOM") == 19


def test_data_parallel_flag_prices_the_paper_specs_under_fsdp_world(capsys):
    """`simulate --engine --data-parallel fsdp_world`: the paper's specs in this engine with its
    states sharded over every GPU as ZeRO-3 (`burst-bench run --data-parallel fsdp_world`):
    every cell that can run fits (Ulysses cannot split 32 heads over 64 ranks). A paper
    system's cell cannot take it, and an attention spec or an unknown value is refused."""
    from suites.simulate import main, simulate_spec
    from suites.spec import SpecError, load_spec

    spec = load_spec("paper_main_7b")
    world = spec.as_this_engine().with_data_parallel("fsdp_world")
    assert world.name == "paper_main_7b-engine-fsdp_world"
    rows = simulate_spec(world, HW)
    assert [r["status"] for r in rows].count("ok") == 19
    assert [(r["label"], r["world"], r["status"]) for r in rows if r["status"] != "ok"] == [
        ("Deepspeed-Ulysses", 64, "skipped")]  # 32 heads over 64 ranks
    assert {json.loads(r["spec"])["data_parallel"] for r in rows} == {"fsdp_world"}
    paper = simulate_spec(spec.with_data_parallel("fsdp_world"), HW)
    assert {r["status"] for r in paper} == {"error"}
    assert "is this project's" in paper[0]["error"]
    for bad, why in (("paper_kernel_32gpu", "only train_step specs"), ("paper_main_7b", "zero3")):
        with pytest.raises(SpecError, match=why if bad != "paper_main_7b" else "unknown"):
            load_spec(bad).with_data_parallel("fsdp_world" if bad != "paper_main_7b" else why)
    assert main(["paper_main_7b", "--engine", "--data-parallel", "fsdp_world"]) == 0
    out = capsys.readouterr().out
    assert out.count("tokens/s") == 19 and "oom" not in out
    assert main(["paper_main_7b", "--engine", "--data-parallel", "zero3"]) == 2
    assert "unknown data_parallel 'zero3'" in capsys.readouterr().err
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert "prices that run: 19 of `paper_main_7b`'s 20 cells fit then" in readme


def test_a_simulation_that_reproduces_its_stored_rows_leaves_them_as_they_are(tmp_path):
    """`make figures` rewrote every committed simulation whose numbers had not changed (their
    date and commit only), so a plain reproduction left the tree dirty. A row that differs in
    anything else is written again."""
    from results import store
    from suites.simulate import simulate_spec, write_rows

    rows = simulate_spec("smoke", HW, tmp_path)
    (run,) = (tmp_path / "smoke").iterdir()
    before = {f: (run / f).read_bytes() for f in (store.ROWS, store.TABLE, "table.csv")}
    meta = store.read_meta(run)
    later = [{**r, "date": "2099-01-01T00:00:00Z", "git_commit": "f" * 40} for r in rows]
    write_rows(later, run, meta)
    assert {f: (run / f).read_bytes() for f in before} == before
    (run / "table.csv").unlink()  # a table that lags its rows is made again all the same
    write_rows(later, run, meta)
    assert {f: (run / f).read_bytes() for f in before} == before
    later[0]["time_s"] = (later[0]["time_s"] or 1.0) * 2
    write_rows(later, run, meta)
    assert store.read_rows(run / store.ROWS)[0]["git_commit"] == "f" * 40


def test_simulate_checks_every_spec_before_it_writes_any(tmp_path, capsys):
    """`simulate good bad --out D` wrote the good spec's run, then failed on the bad one (exit
    2, half done); every spec is now loaded and checked first (a harness audit)."""
    from suites.simulate import main

    assert main(["smoke", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "no spec file" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_system_profile_offload_applies_to_training_cells():
    """A system whose profile says optimizer_offload (InternEvo, DeepSpeed and BurstEngine as
    the paper ran them; not Megatron) is priced with its optimizer state on the host, without
    the caller asking."""
    impls = implementations()
    lt = impls["loongtrain_double_ring"]
    assert [n for n, im in impls.items() if not im.optimizer_offload] == ["megatron_cp"]
    cell = as_cell(dict(workload="train_step", method="double_ring", model="7b",
                        seq_len=1 << 20, world=32, ranks_per_node=8,
                        options={"ranks_per_node": 8}, checkpointing="selective",
                        paper="loongtrain_double_ring"))
    on_gpu = dataclasses.replace(lt, optimizer_offload=False)
    with_profile, without = predict(cell, HW, lt), predict(cell, HW, on_gpu)
    assert with_profile.memory.reserved < without.memory.reserved
    assert with_profile.parts["optimizer"] > without.parts["optimizer"]
    # the same as asking for offload explicitly
    asked = predict(cell, HW, on_gpu, offload=True)
    assert asked.memory.reserved == with_profile.memory.reserved


def test_a_gelu_mlp_model_is_priced_and_counted_as_built():
    """BurstEngine's runs build its 7B with a two-matrix GELU MLP (its config's activate_fn,
    ``gelu_mlp_models``): fewer parameters, FLOPs and MLP activations than the SwiGLU 7B of
    the other systems, while a row's FLOPs and MFU stay the named model's (as the paper's);
    its 14B is SwiGLU as the config's."""
    from burst.engine.configs import get_config
    from burst.flops import model_flops
    from suites.implementations import Implementation

    be = implementations()["burstengine"]
    assert be.gelu_mlp_models == ("7b",)  # a TOML list, kept as a tuple
    with pytest.raises(ValueError, match="gelu_mlp_models='7b' must be a list of model names"):
        Implementation(name="x", gelu_mlp_models="7b")  # not the models '7' and 'b'
    swiglu = be.with_values(gelu_mlp_models=())
    for model, seq in (("7b", 1 << 21), ("14b", 1 << 20)):
        cell = dict(workload="train_step", method="burst", model=model, seq_len=seq, world=32,
                    ranks_per_node=8, options={"ranks_per_node": 8}, checkpointing="selective",
                    fused_head=True, paper="burstengine")
        gelu, glu = predict(cell, HW, be), predict(cell, HW, swiglu)
        if model == "14b":
            assert gelu.memory.parts == glu.memory.parts and gelu.time_s == glu.time_s
            continue
        cfg = get_config("7b")
        tokens = seq // 32
        # the recomputed layer keeps up and gelu(up), not gate, up, silu(gate) and the product
        saved = 2 * tokens * cfg.ffn_size * 2
        gathered = 3 * cfg.hidden_size * cfg.ffn_size * 2 * 3  # two layers' weights + a grad
        assert glu.memory.parts["layer_backward"] - gelu.memory.parts["layer_backward"] == saved
        assert glu.memory.parts["gathered_params"] - gelu.memory.parts["gathered_params"] == \
            pytest.approx(gathered / 3)
        assert gelu.time_s < glu.time_s
        row = simulate_cell(cell, HW)
        assert row["time_s"] == gelu.time_s
        assert row["mfu_model_flops_causal"] == pytest.approx(
            model_flops(cfg, 1, seq, "model_flops_causal", "selective") / row["time_s"] / 32
            / 1e12 / HW.peak_tflops)


def test_burstengine_keeps_rope_tables_of_the_whole_sequence():
    """BurstEngine's RoPE caches cos and sin for the whole sequence on every GPU, in bf16
    (``global_token_bytes``: 2 tables x head_dim x 2 bytes a token, counted from its code),
    for its three paper systems and both paper models; the tables are the only global buffer."""
    from burst.engine.configs import get_config

    for name in ("burstengine", "burst", "burstengine_usp"):
        impl = implementations()[name]
        for model in ("7b", "14b"):
            assert impl.global_token_bytes == 2 * get_config(model).head_dim * 2, (name, model)
    cell = dict(workload="train_step", method="burst", model="14b", seq_len=1 << 20, world=32,
                ranks_per_node=8, options={"ranks_per_node": 8}, checkpointing="selective",
                fused_head=True, paper="burstengine")
    with_tables = predict(cell, HW, implementations()["burstengine"]).memory
    without = predict(cell, HW, implementations()["burstengine"].with_values(
        global_token_bytes=0.0)).memory
    assert with_tables.parts["implementation"] == 512 * (1 << 20)  # 0.5 GiB at 1M tokens
    assert with_tables.allocated - without.allocated == 512 * (1 << 20)


def test_attention_rate_diagnostic_round_trips(evals):
    """The implied attention rate equals the simulated one when the published step time is
    the simulated one, and the LoongTrain-Ring 14B rows are the ones far below it."""
    row = next(e for e in evals if e["table"] == "main" and e["method"] == "burstengine"
               and e["model"] == "7b" and e["world"] == 32 and e["checkpointing"] == "selective")
    cell = next(c for r, c in calibrate.paper_cells() if c.paper == "burstengine"
                and c.model == "7b" and c.world == 32 and c.checkpointing == "selective")
    impl = implementations()["burstengine"]
    p = predict(cell, HW, impl)
    implied, sim = calibrate._attention_rates(cell, p, row["simulated"])
    assert implied == pytest.approx(sim, rel=1e-9) and sim == pytest.approx(
        row["attn_tflops_sim"])
    # a model the cell defines itself (a spec's model_config) is read from the cell, not
    # looked up by its name: 7b's fields under another name give 7b's rates (with the GELU MLP
    # that BurstEngine's runs built for the name 7b: gelu_mlp_models)
    from burst.engine.configs import get_config

    fields = dataclasses.asdict(dataclasses.replace(get_config("7b"), gated_mlp=False))
    own = dataclasses.replace(cell, model="mine", model_config=fields)
    assert calibrate._attention_rates(own, predict(own, HW, impl), row["simulated"]) == (
        implied, sim)
    ratios = {(e["model"], e["method"], e["checkpointing"]):
              e["attn_tflops_implied"] / e["attn_tflops_sim"]
              for e in evals if e["attn_tflops_implied"]}
    low = {k for k, v in ratios.items() if v < 0.8}
    assert low == {("14b", "loongtrain_double_ring", "selective"),
                   ("14b", "loongtrain_double_ring", "full")}


def test_fit_reproduces_the_shipped_constants():
    """The fit starts from fixed values, so it is a function of the data and the model: its
    output is exactly what the data files ship (nobody edited a fitted constant by hand). Its
    memory part never calls a run OOM whose memory the paper measured."""
    res = calibrate.fit()
    shipped = calibrate.constants(HW, implementations())
    assert [(c["name"], c["value"]) for c in res.constants] == \
        [(c["name"], c["value"]) for c in shipped]
    measured = [e for e in res.evals if e["mem_paper_gib"] is not None]
    assert measured and all(e["status_sim"] == "ok" for e in measured)


def test_kernel_table_alone_predicts_burstengines_training_rows():
    """Out of sample: the time constants fitted on the attention-only table (no training step
    in it) predict every BurstEngine training row within 15%, median within 5% (the reverse
    fit, which the doc also reports, is left to ``python -m suites.calibrate``)."""
    held = calibrate.holdout(fit_on=("kernel",))
    s = calibrate.holdout_summary(held["kernel"].evals)["burstengine"]
    assert s["rows"] == 16 and s["median"] <= 0.05 and s["worst"] <= 0.15
    doc = calibrate.DOC.read_text()
    assert f"median |error| {100 * s['median']:.1f}% and worst {100 * s['worst']:.1f}%" in doc


def test_rows_follow_the_schema_and_mark_failures():
    ok = simulate_cell(dict(workload="attention", method="burst", seq_len=1 << 20, world=32,
                            ranks_per_node=8, heads=40, head_dim=128,
                            options={"ranks_per_node": 8}, paper="burst"), "a800")
    assert ok["source"] == "simulated" and ok["executor"] == "simulate"
    assert ok["status"] == "ok" and ok["hardware"] == "a800"
    assert ok["attn_tflops"] == pytest.approx(185, rel=0.05)  # published: 187.7
    bad = simulate_cell(dict(workload="attention", method="ulysses", seq_len=4096, world=8,
                             heads=4, head_dim=64), "a800")
    assert bad["status"] == "error" and "ulysses" in bad["error"].lower()
    assert OURS.attention_efficiency == 1.0


def test_spec_simulates_like_a_run(tmp_path):
    spec = tmp_path / "tiny_sim.toml"
    spec.write_text('description = "t"\nworkload = "attention"\ndevice = "cuda"\n'
                    'baseline = "zigzag_ring"\n'
                    'dtype = "bfloat16"\nseq_lens = [65536]\nnodes = 2\ngpus_per_node = 4\n'
                    '[shape]\nheads = 8\nhead_dim = 128\n[[methods]]\nname = "burst"\n'
                    'options = { ranks_per_node = "@node" }\n[[methods]]\nname = "zigzag_ring"\n')
    from results import store
    from suites.simulate import simulate_spec

    rows = simulate_spec(spec, "h100", out_dir=tmp_path / "out")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert rows[0]["time_s"] < rows[1]["time_s"]  # burst double ring vs the flat ring
    run = tmp_path / "out" / "tiny_sim" / "simulated-h100"
    assert store.read_meta(run)["hardware"] == "h100"
    table = store.load(run)  # speedup against the spec's baseline, as for a measured run
    assert table["speedup"].tolist() == pytest.approx([rows[1]["time_s"] / rows[0]["time_s"], 1])


def test_hardware_profiles_give_every_value_a_source(tmp_path):
    from suites.hardware import FIELDS, OPTIONAL_FIELDS, names

    assert {"a800", "a100", "h100", "h200"} <= set(names())
    for n in names():
        hw = load(n)
        assert all(hw.sources.get(key) for key, _, _ in (*FIELDS, *OPTIONAL_FIELDS)), n
        # each source says what kind it is (the profiles' header: two said neither)
        kinds = ("datasheet", "design", "measured", "assumed", "calibrated")
        unlabelled = {k: s for k, s in hw.sources.items() if not s.startswith(kinds)}
        assert not unlabelled, (n, unlabelled)
        assert hw.usable_gib < hw.memory_gib, n
        # MFU's peak is one number per GPU: a simulated row's and a measured row's
        assert hw.peak_tflops == peak_tflops(n.upper()), n
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[gpu]\npeak_bf16_tflops = 3\n')
    with pytest.raises(ValueError, match="peak_bf16_tflops"):
        load(bad)



def test_hardware_profiles_reject_bools_tiles_under_a_token_and_name_a_broken_file(tmp_path):
    """A bool was read as 1.0 (true is no efficiency), causal_tile_tokens = 0 made a causal
    call more than fully efficient, and a profile that is not TOML raised without its file."""
    import re

    from suites.hardware import profile_path

    # a copy under its own name (one that keeps a shipped name is refused, tested below)
    text = profile_path("a800").read_text().replace('name = "a800"', 'name = "copy"')

    def profile(name, pattern, repl):
        new = re.sub(pattern, repl, text, count=1, flags=re.M)
        assert new != text
        (tmp_path / f"{name}.toml").write_text(new)
        return tmp_path / f"{name}.toml"

    for name, pattern, repl, match in (
            ("eta", r"^(fwd_eta_max = \{ value = )[0-9.]+", r"\1true", "fwd_eta_max=True"),
            ("gpus", r"^(gpus = \{ value = )8", r"\1true", "node.gpus=True"),
            ("tile", r"^(causal_tile_tokens = \{ value = )[0-9.]+", r"\g<1>0",
             "causal_tile_tokens=0.0 must be >= 1")):
        with pytest.raises(ValueError, match=re.escape(match)) as ei:
            load(profile(name, pattern, repl))
        assert str(tmp_path / f"{name}.toml") in str(ei.value)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "broken.toml"))):
        load(profile("broken", r"^(gpus = \{ value = 8),", r"\1"))
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe" + text.encode())  # not UTF-8
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'binary.toml'}: not valid TOML")):
        load(tmp_path / "binary.toml")
    # no memory, and an allocator that reserves twice what is allocated (a CLI fuzz: every
    # cell came out "0.00 GiB reserved > 0.00 GiB usable")
    for field, match in (("memory_gib", "memory_gib=0 must be positive"),
                         ("usable_gib", "usable_gib=0 must be positive"),
                         ("allocator_overhead", "allocator_overhead=1.0 must be below 1")):
        with pytest.raises(ValueError, match=re.escape(match)):
            HW.with_values(**{field: 0 if field != "allocator_overhead" else 1.0})
    with pytest.raises(ValueError, match="fwd_eta_max=True"):
        HW.with_values(fwd_eta_max=True)


def test_each_dtype_runs_at_its_own_peak():
    """A float32 or float64 cell is not priced at the bf16 tensor-core rate: float32 attention
    runs torch's memory-efficient kernel as three TF32 products, float32 GEMMs on the CUDA
    cores, float64 at the FP64 peak; MFU (a bf16 figure) is left out, as a run leaves it out."""
    assert HW.peak("float32", "attention") == pytest.approx(156 / 3)
    assert HW.peak("float32", "gemm") == 19.5 and HW.peak("float64") == 19.5
    assert HW.peak("float16") == HW.peak("bfloat16") == 312
    with pytest.raises(ValueError, match="dtype"):
        HW.peak("int8")
    cell = dict(workload="attention", method="burst", seq_len=1 << 20, world=32,
                ranks_per_node=8, heads=32, head_dim=128, options={"ranks_per_node": 8})
    rows = {dt: simulate_cell({**cell, "dtype": dt}, HW) for dt in ("bfloat16", "float32")}
    # kernel-bound at 32K tokens per GPU: the time follows the attention peak
    assert rows["float32"]["time_s"] / rows["bfloat16"]["time_s"] == pytest.approx(6, rel=0.05)
    assert rows["float32"]["bytes_sent_forward"] == 2 * rows["bfloat16"]["bytes_sent_forward"]
    train = dict(workload="train_step", method="burst", model="7b", seq_len=1 << 17, world=8,
                 checkpointing="selective", fused_head=True, paper="burstengine")
    bf16, fp32 = (predict({**train, "dtype": dt}, HW, ZERO3_ON_GPU)
                  for dt in ("bfloat16", "float32"))
    # the GEMMs at the CUDA cores' 19.5 against 312 (priced at the attention kernel's 52, a
    # float32 layer came out 5.8x a bf16 one instead of 8.1x, and passed "> 5": a test audit)
    assert HW.gemm_seconds(1e15, "float32") / HW.gemm_seconds(1e15, "bfloat16") == \
        pytest.approx(312 / 19.5)
    assert 7.5 < fp32.parts["layers_forward"] / bf16.parts["layers_forward"] < 9
    # float32 weights, gradients and activations, no master copy: same states, twice the
    # activations (the cached lse is fp32 in both)
    assert fp32.memory.parts["model_states"] == bf16.memory.parts["model_states"]
    assert 1.95 < fp32.memory.parts["checkpoints"] / bf16.memory.parts["checkpoints"] < 2
    row = simulate_cell({**train, "dtype": "float32"}, HW)
    assert row["peak_tflops"] is None and row.get("mfu_model_flops_causal") is None
    assert simulate_cell({**train, "dtype": "bfloat16"}, HW)["mfu_model_flops_causal"] > 0


# ---------------------------------------------------------------------------------------------
# Bytes per rank: simulator == byte counter on real gloo ranks

WORLD, RPN = 4, 2
# (method, options, cell): causal MHA float32 unless the cell says otherwise; a window, GQA,
# bf16 (elements of 2 bytes, accumulators of 4), each layout and backward
BYTE_CASES = [
    ("burst", {"backward": "burst"}, {}),
    ("burst", {"backward": "burst", "ranks_per_node": 2}, {}),
    ("burst", {"backward": "ring", "ranks_per_node": 2}, {}),
    ("burst", {"backward": "burst", "layout": "contiguous"}, {"window": (5, 0)}),
    ("burst", {"backward": "ring", "layout": "striped"}, {"window": (5, 0)}),
    ("burst", {"backward": "burst", "grad_acc": "input"}, {"dtype": "bfloat16"}),
    ("burst", {"backward": "auto", "layout": "contiguous"}, {"kv_heads": 1, "window": (5, 0)}),
    ("burst", {"backward": "auto"}, {"kv_heads": 2, "dtype": "bfloat16"}),
    ("burst", {"backward": "burst", "layout": "contiguous"}, {"causal": False, "window": (3, 2)}),
    ("ring", {}, {"window": (5, 0)}),
    ("zigzag_ring", {}, {}),
    ("striped_ring", {}, {"kv_heads": 2}),
    ("double_ring", {"ranks_per_node": 2}, {"dtype": "bfloat16"}),
    ("ulysses", {}, {}),
    ("usp", {"ulysses_degree": 2}, {}),
    ("usp", {"ulysses_degree": 2, "backward": "burst"}, {"kv_heads": 2}),
    ("allgather", {}, {"window": (5, 0)}),
]
SHAPE = dict(batch=1, seq_local=8, heads=4, kv_heads=4, head_dim=8)


def _cell(cell: dict) -> dict:
    return {"causal": True, "window": None, "kv_heads": 4, "dtype": "float32"} | cell


def _count_rank(rank: int, world: int, cases):
    import torch

    from baselines import registry

    torch.manual_seed(0)
    out = []
    n = SHAPE["seq_local"] * world
    for name, opts, cell in cases:
        c = _cell(cell)
        method = registry.get(name)
        lay = method.layout(opts)
        dt = getattr(torch, c["dtype"])
        q = torch.randn(1, n, 4, 8, dtype=dt)
        k, v = (torch.randn(1, n, c["kv_heads"], 8, dtype=dt) for _ in range(2))
        q, k, v = (shard(t, layout=lay).requires_grad_() for t in (q, k, v))
        with comm.count_bytes(ranks_per_node=RPN) as cnt:
            with comm.phase("forward"):
                o = method(q, k, v, causal=c["causal"], window=c["window"], **opts)
            with comm.phase("backward"):
                o.float().sum().backward()
        out.append({p: cnt.sent(phase=p) for p in ("forward", "backward")}
                   | {lk: cnt.sent(link=lk) for lk in ("intra", "inter")})
    return out


def _count_all(rank: int, world: int) -> dict:
    return {"attention": _count_rank(rank, world, BYTE_CASES),
            "train": _measure_train_cells(rank, world)}


_COUNTED: list = []


def _counted(kind: str) -> list:
    """Each rank's counts of one spawn of WORLD ranks (RPN per node) for both byte tests:
    ``attention`` (``_count_rank`` of BYTE_CASES), ``train`` (``_measure_train_cells``)."""
    if not _COUNTED:
        _COUNTED.append(spawn(_count_all, WORLD, timeout_s=400))
    return [r[kind] for r in _COUNTED[0]]


def test_simulated_bytes_equal_counted_bytes():
    """Every byte column of a simulated row equals the byte counter's, taken like a measured
    row's: the maximum over ranks of each column; with windows (a contiguous ring shortened),
    GQA, bf16 elements with fp32 accumulators, every layout, backward and ring method."""
    per_rank = _counted("attention")
    counted = [{col: max(r[i][col] for r in per_rank) for col in per_rank[0][i]}
               for i in range(len(BYTE_CASES))]
    for (name, opts, cell), got in zip(BYTE_CASES, counted, strict=True):
        c = _cell(cell)
        row = simulate_cell(dict(workload="attention", method=name, options=opts,
                                 seq_len=SHAPE["seq_local"] * WORLD, world=WORLD,
                                 ranks_per_node=RPN, heads=4, head_dim=8, **c), "a800")
        assert row["status"] == "ok", (name, row["error"])
        want = {"forward": row["bytes_sent_forward"], "backward": row["bytes_sent_backward"],
                "intra": row["bytes_sent_intra"], "inter": row["bytes_sent_inter"]}
        assert got == want, (name, opts, cell, got, want)


# (backward, ranks_per_node, mask): flat rings, double rings of 2 nodes x 3 and 3 x 2 on 6
# ranks, of 3 x 3 on 9; windows that shorten a flat ring or send its blocks both ways
# (burst.masks.ring_reach of 16 tokens a rank; zigzag chunks of 8: a causal window of 12
# needs ranks r-1, r-2 and r+1, r+2)
ZIGZAG = dict(layout="zigzag", causal=True)
BUFFER_CASES = {
    6: [("burst", None, ZIGZAG), ("ring", None, ZIGZAG), ("burst", 3, ZIGZAG),
        ("ring", 3, ZIGZAG), ("burst", 2, ZIGZAG),
        ("burst", None, ZIGZAG | dict(window=(12, 0))),  # (2, 2)
        ("ring", None, ZIGZAG | dict(window=(12, 0))),
        ("burst", None, ZIGZAG | dict(window=(4, 0))),  # (1, 1)
        ("burst", None, dict(layout="contiguous", causal=False, window=(0, 20))),  # (0, 2)
        ("ring", None, dict(layout="contiguous", causal=False, window=(20, 4))),  # (2, 1)
        ("burst", None, dict(layout="contiguous", causal=True, window=(4, 0)))],  # (1, 0)
    9: [("burst", 3, ZIGZAG), ("ring", 3, ZIGZAG),
        ("burst", None, ZIGZAG | dict(window=(20, 0)))]}  # (3, 3)


def _ring_buffer_peaks(rank: int, world: int) -> list[int]:
    """Per case, the most bytes of burst.ring's blocks and accumulators (every tensor its
    _empty and _zeros make in the backward, until freed) alive at once on this rank."""
    import weakref

    import torch

    import burst.ring as ring_mod
    from burst.attention import burst_attn

    live, made = [0, 0], (ring_mod._empty, ring_mod._zeros)

    def tracked(make):
        def wrapper(like):
            out = make(like)
            for t in out:
                live[0] += t.numel() * t.element_size()
                weakref.finalize(t, _drop, live, t.numel() * t.element_size())
            live[1] = max(live[1], live[0])
            return out
        return wrapper

    peaks = []
    torch.manual_seed(rank)
    for backward, rpn, mask in BUFFER_CASES[world]:
        q, k, v = (torch.randn(1, 16, 4, 8, requires_grad=True) for _ in range(3))
        o = burst_attn(q, k, v, backward=backward, ranks_per_node=rpn, **mask)
        ring_mod._empty, ring_mod._zeros = (tracked(m) for m in made)
        live[:] = [0, 0]
        try:
            o.sum().backward()
        finally:
            ring_mod._empty, ring_mod._zeros = made
        peaks.append(live[1])
    return peaks


def _drop(live: list, nbytes: int) -> None:
    live[0] -= nbytes


def test_simulated_ring_buffers_are_what_burst_ring_holds():
    """The memory model's ring buffers (``comm_buffers`` less the accumulators that stay home)
    equal the most bytes of blocks and travelling accumulators ``burst.ring`` holds at once in
    a backward on gloo ranks: a flat ring two blocks and three accumulators, a double ring of
    2 nodes three blocks and five, of more nodes four and five (with inner rings of 2, a block
    fewer), a flat ring sending both ways up to two blocks and two accumulators more for its
    second chain (replayed step by step, burst.ring._flat, from (1, 0) to (3, 3)). It had counted
    two and two, three and three (2 GiB too few for Burst-Ring's 7B at 2M tokens on 32 GPUs)."""
    for world, cases in BUFFER_CASES.items():
        per_rank = spawn(_ring_buffer_peaks, world, timeout_s=300)
        for i, (backward, rpn, mask) in enumerate(cases):
            opts = {"backward": backward, "layout": mask["layout"]} | (
                {"ranks_per_node": rpn} if rpn else {})
            # a flat ring's buffers do not depend on its nodes (9 ranks fill no 8-GPU node)
            cell = dict(workload="attention", method="burst", seq_len=16 * world, world=world,
                        ranks_per_node=rpn or 3, heads=4, head_dim=8,
                        causal=mask["causal"], window=mask.get("window"), dtype="float32",
                        options=opts)
            parts = predict(cell, HW).memory.parts
            local = 16 * (2 * 4 if backward == "burst" else 4) * 8 * 4  # dK, dV or dQ at home
            assert parts["comm_buffers"] - local == max(r[i] for r in per_rank), (world, opts,
                                                                               mask)


ALLGATHER_CASES = [  # (world, dtype, batch, tokens a rank, heads, kv heads, head dim)
    (4, torch.bfloat16, 1, 16, 2, 2, 256), (4, torch.float32, 1, 16, 2, 2, 256),
    (2, torch.bfloat16, 1, 32, 4, 2, 128), (1, torch.bfloat16, 1, 64, 2, 2, 256),
    (4, torch.bfloat16, 2, 16, 2, 2, 256)]


def _allgather_backward_peaks(rank: int, world: int) -> list[int]:
    """Per case of ``ALLGATHER_CASES`` on this many ranks, the most CPU bytes alive at once in
    one allgather backward on this rank, above what was alive before it
    (burst.memory.ProfilerPeak, the harness's CPU peak); one spawn runs them all."""
    from baselines.allgather import allgather_attn
    from burst.memory import ProfilerPeak

    peaks = []
    for _, dtype, b, n, h, hk, d in (c for c in ALLGATHER_CASES if c[0] == world):
        torch.manual_seed(rank)
        q = torch.randn(b, n, h, d, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(b, n, hk, d, dtype=dtype, requires_grad=True) for _ in range(2))
        o = allgather_attn(q, k, v, causal=True)
        dout = torch.randn_like(o)
        with ProfilerPeak() as p:
            o.backward(dout)
        peaks.append(p.peak_bytes)
    return peaks


def test_simulated_allgather_buffers_are_what_its_backward_holds():
    """The all-gather method's buffers (``comm_buffers``) against the CPU peak of its backward
    on gloo ranks: the peak holds them all, and beyond them no more than the model leaves out
    (the gradients returned, D, a few fp32 score blocks of the CPU kernel, and two
    whole-sequence K's in the input dtype: gloo's staging of the gather and its reduce-scatter,
    a reduce of a cloned piece per rank; the peaks vary by such pieces from run to run, 557184
    to 622720 bytes on one rank of the first case: a review saw 4 to 8 pieces above the model
    over some 290 rank peaks, against 12 allowed). They were counted as K, V and their gradients
    in the input dtype, where the code accumulates the gradients over the whole sequence in
    fp32 beside an fp32 dq: 262144 bytes against a peak of 573568 here, and a 4M-token cell
    on 32 A800s priced at 39.8 GiB reserved, 67.8 counted so (a metamorphic audit)."""
    worlds = sorted({c[0] for c in ALLGATHER_CASES})
    per_world = {w: spawn(_allgather_backward_peaks, w, timeout_s=120) if w > 1
                 else [_allgather_backward_peaks(0, 1)] for w in worlds}  # [rank][case]
    for world, dtype, b, n, h, hk, d in ALLGATHER_CASES:
        i = [c for c in ALLGATHER_CASES if c[0] == world].index((world, dtype, b, n, h, hk, d))
        peaks = [ranks[i] for ranks in per_world[world]]
        cell = dict(workload="attention", method="allgather", seq_len=n * world, world=world,
                    batch=b, heads=h, kv_heads=hk, head_dim=d, causal=True,
                    dtype=str(dtype).removeprefix("torch."), options={"layout": "zigzag"})
        model = predict(cell, HW).memory.parts["comm_buffers"]
        e = dtype.itemsize
        # (a group of one stages nothing: its collectives return their input)
        left_out = b * ((n * h * d + 2 * n * hk * d) * e + n * h * 4 + 8 * n * n * h * 4
                        + 2 * (world > 1) * world * n * hk * d * e)
        assert model <= min(peaks) and max(peaks) <= model + left_out, (world, dtype, peaks,
                                                                        model)


@pytest.mark.parametrize("sweep", ["cpu_scaling", "cpu_long"])
def test_committed_cpu_runs_send_the_simulated_bytes(sweep):
    """The measured CPU sweeps kept in results/ (up to 1M tokens over 8 ranks, windowed) sent
    exactly what the simulator predicts for the same cells, column by column (every ok row of
    every run there, so a local partial run is checked too, not mistaken for the kept one)."""
    from results import store
    from suites.cells import expand
    from suites.spec import load_spec

    cells = {c.cell_id: c for c in expand(load_spec(sweep))}
    cols = [f"bytes_sent_{c}" for c in ("forward", "backward", "intra", "inter")]
    checked = set()
    for run in store.runs_by_time(calibrate.REPO / "results" / sweep):
        for measured in store.read_rows(run / store.ROWS):
            cell = cells.get(measured["cell_id"])
            if cell is None or measured["status"] != "ok":
                continue
            row = simulate_cell(cell, "a800")
            assert [measured.get(c) for c in cols] == [row[c] for c in cols], cell.describe()
            checked.add(cell.cell_id)
    # every ok cell of the kept run (a changed spec must be measured again)
    assert len(checked) == {"cpu_scaling": 51, "cpu_long": 6}[sweep]


@pytest.mark.parametrize(("method", "options", "world", "window"), [
    ("ring", {}, 8, (300, 0)),  # a truncated ring: a mid-node rank's home hop stays on NVLink
    ("usp", {"ulysses_degree": 2, "backward": "burst"}, 16, None),  # ring members = rank // U
])
def test_byte_columns_are_the_busiest_rank_of_all(method, options, world, window):
    """Each byte column is the maximum over every rank of the method's formula (it was taken
    over the ranks at node edges only, and missed mid-node ranks by up to a third)."""
    from baselines import registry

    seq, heads = 256 * world, 8
    row = simulate_cell(dict(workload="attention", method=method, options=options, seq_len=seq,
                             world=world, ranks_per_node=4 if world == 8 else 8, heads=heads,
                             head_dim=16, causal=True, window=window, dtype="bfloat16"), "a800")
    vols = [registry.get(method).bytes(
        world=world, batch=1, seq_local=seq // world, heads=heads, kv_heads=heads, head_dim=16,
        elem=2, acc_elem=4, node_size=4 if world == 8 else 8, causal=True, window=window,
        rank=r, **options) for r in range(world)]
    for col, (phase, link) in {"forward": ("forward", None), "backward": ("backward", None),
                               "intra": (None, "intra"), "inter": (None, "inter")}.items():
        assert row[f"bytes_sent_{col}"] == max(v.sent(phase, link) for v in vols), col


@pytest.mark.parametrize(("change", "why"), [
    (dict(method="ring_flash_attn", dtype="float32"), "computes in float16 or bfloat16"),
    (dict(method="yunchang", dtype="float64"), "computes in bfloat16"),
    # ring_flash_attn_func's backward returns dq in bf16: fp16 only where q's dtype comes back
    (dict(method="ring_flash_attn", dtype="float16", options={"layout": "contiguous"},
          causal=False), "computes in bfloat16, not float16"),
    (dict(method="yunchang", window=(1024, 0)), "does not support window"),
    (dict(method="burst", options={"foo": 1}), "has no option 'foo'"),
    (dict(method="tp"), "is block-level"),
])
def test_cells_the_code_refuses_get_no_numbers(change, why):
    """What the method itself would refuse (flash-attn's dtypes, a package's missing window, an
    unknown option, a block-level method) is an error row, not a priced one."""
    cell = dict(workload="attention", method="ring", seq_len=1 << 16, world=8, heads=8,
                head_dim=128, causal=True, dtype="bfloat16") | change
    row = simulate_cell(cell, "a800")
    assert row["status"] == "error" and why in row["error"], row["error"]
    assert row["time_s"] is None and row["bytes_sent_forward"] is None


def test_gathers_run_at_the_nodes_nics_all_to_alls_at_each_gpus_share():
    """An all-gather (NCCL's ring) carries G - 1 shards over every link, the node's way out
    through all its NICs included (bus bandwidth = the node's NICs, DESIGN.md 4); an
    all-to-all's off-node share is every GPU's own data. They were priced alike (all-gathers
    and ZeRO-3 collectives ~6x too slow across nodes), then gathers as if each off-node shard
    entered a node once (G - L shards: 1.9x too fast on 2 nodes of 8)."""
    from suites.schedule import collective_seconds

    shard = 64 << 20
    nbytes = 31 * shard  # an all-gather over 32 ranks (4 nodes of 8): 31 shards to receive
    node_nics = HW.nics_per_node * HW.nic_gbps * HW.nic_efficiency * 1e9
    latency = 31 * 1e-6 * HW.nic_latency_us / 4 + 1e-6 * HW.nic_latency_us
    gather = collective_seconds(HW, nbytes, 32, Topo(32, 8), "gather")
    assert gather == pytest.approx(31 * shard / node_nics + latency)  # the ring's 31 shards
    a2a = collective_seconds(HW, nbytes, 32, Topo(32, 8))
    assert a2a == pytest.approx(24 * shard * 8 / node_nics + latency)  # 8 GPUs' own shares
    one_node = [collective_seconds(HW, 7 * shard, 8, Topo(8, 8), k) for k in ("gather",
                                                                             "all_to_all")]
    assert one_node[0] == one_node[1]  # inside a node both are NVLink-bound alike
    with pytest.raises(ValueError, match="kind='broadcast'; valid: all_to_all, gather"):
        collective_seconds(HW, nbytes, 32, Topo(32, 8), "broadcast")


def test_replicated_weights_gather_once_per_step_not_per_layer():
    """Megatron's distributed optimizer keeps the weights whole (its memory model): its step
    pays one reduce-scatter of the fp32 main gradients and one all-gather of the bf16 weights of
    the whole model, not ZeRO-3's three collectives of every layer."""
    from burst.engine.configs import get_config
    from suites.schedule import collective_seconds
    from suites.simulate import _param_count

    cell = as_cell(dict(workload="train_step", method="burst", model="7b", seq_len=1 << 18,
                        world=32, ranks_per_node=8, options={"ranks_per_node": 8},
                        checkpointing="full", fused_head=False))
    zero3 = ZERO3_ON_GPU
    mega = zero3.with_values(replicated_bytes_per_param=6.0)
    params = _param_count(get_config("7b"))
    once = sum(collective_seconds(HW, params * b * 31 / 32, 32, Topo(32, 8), "gather")
               for b in (4, 2))  # fp32 main gradients reduce-scattered, bf16 weights gathered
    z, m = predict(cell, HW, zero3), predict(cell, HW, mega)
    assert m.parts["state_collectives"] == pytest.approx(once)
    assert z.parts["state_collectives"] != pytest.approx(once)
    assert m.time_s == pytest.approx(z.time_s - z.parts["layers_forward"]
                                     - z.parts["layers_backward"] + m.parts["layers_forward"]
                                     + m.parts["layers_backward"] + once)


def test_a_group_of_one_holds_no_transfer_buffers():
    """One rank sends nothing: its ring keeps only its fp32 gradient accumulators and its
    collectives return their input (they were charged 4-18 GiB of buffers at 128K tokens); the
    all-gather method keeps its fp32 dq, dk, dv as the ring does (it was counted 0: the
    peak test above measures them)."""
    n, h, d = 1 << 17, 32, 128
    base = dict(workload="attention", seq_len=n, world=1, heads=h, head_dim=d, causal=True,
                dtype="bfloat16")
    parts = {m: predict(as_cell(dict(base, method=m, options=o)), HW).memory.parts["comm_buffers"]
             for m, o in (("allgather", {}), ("ulysses", {}), ("burst", {}),
                          ("usp", {"ulysses_degree": 1}))}
    fp32_grads = 3 * n * h * d * 4  # dq, dk, dv
    assert parts == {"allgather": fp32_grads, "ulysses": 0, "burst": fp32_grads,
                     "usp": fp32_grads}
    # usp over one node's 8 ranks (a ring of one) = Ulysses + its ring's fp32 accumulators
    eight = dict(base, world=8)
    ulysses = predict(as_cell(dict(eight, method="ulysses")), HW).memory.parts["comm_buffers"]
    usp = predict(as_cell(dict(eight, method="usp", options={"ulysses_degree": 8})),
                  HW).memory.parts["comm_buffers"]
    assert usp - ulysses / 2 == fp32_grads / 8
    # allgather over 8 holds the gathered K, V and their fp32 gradients of the whole sequence,
    # its fp32 dq and a bf16 copy of dK at its reduce-scatter (halved, a 1M-token cell's
    # buffers passed: a test audit)
    gathered = predict(as_cell(dict(eight, method="allgather")), HW).memory.parts["comm_buffers"]
    assert gathered == (2 * 2 + 2 * 4 + 2) * n * h * d + n // 8 * h * d * 4
    # a batch of 2 twice that, and the reduce-scatter's pieces of dK copied (strided: a chunk
    # of the sequence dimension behind the batch's; the peak test above bounds it from below)
    two = predict(as_cell(dict(eight, method="allgather", batch=2)), HW).memory
    assert two.parts["comm_buffers"] == 2 * gathered + 2 * n * h * d * 2


def test_system_sharding_and_vocabulary_change_memory():
    """Megatron's distributed optimizer keeps bf16 weights and fp32 main grads whole on every
    rank (6 bytes / parameter) and shards only the optimizer (12 / G); a system's own
    vocabulary prices its plain head."""
    from burst.engine.configs import get_config
    from suites.simulate import _param_count

    zero3 = ZERO3_ON_GPU
    mega = zero3.with_values(replicated_bytes_per_param=6.0)
    cell = as_cell(dict(workload="train_step", method="burst", model="14b", seq_len=1 << 20,
                        world=32, ranks_per_node=8, options={"ranks_per_node": 8},
                        checkpointing="full", fused_head=False))
    params = _param_count(get_config("14b"))
    states = predict(cell, HW, mega).memory.parts["model_states"]
    assert states == pytest.approx(6 * params + 12 * params / 32)
    # a float32 model's weight and main gradient are both 4 bytes: 8 whole, m and v sharded
    # (it held 6: its states came out below the bf16 model's, a metamorphic audit)
    fp32 = dataclasses.replace(cell, dtype="float32")
    assert predict(fp32, HW, mega).memory.parts["model_states"] == pytest.approx(
        8 * params + 8 * params / 32)
    assert predict(cell, HW, zero3).memory.parts["model_states"] == pytest.approx(16 * params / 32)
    small = predict(cell, HW, zero3.with_values(vocab_size=32000)).memory
    big = predict(cell, HW, zero3).memory  # the model's 120000
    # embedding + untied head: 2 x V x hidden parameters at 16 bytes / G each
    assert big.parts["model_states"] - small.parts["model_states"] == pytest.approx(
        16 * 2 * (120000 - 32000) * 5120 / 32)
    assert big.allocated > small.allocated


def test_the_plain_heads_logits_take_the_accumulators_dtype():
    """This project's plain head upcasts the logits to the accumulators' dtype (fp32; float64
    for a float64 model, burst.engine.fused_loss.plain_cross_entropy): three such tensors a
    logit at the loss's backward, 12 bytes, 24 in float64 (it was 12 for both: a metamorphic
    audit)."""
    from burst.engine.configs import get_config
    from suites.memory_model import head_bytes

    cfg = get_config("1b")
    tokens = 8192
    for elem, per_logit in ((2, 12), (4, 12), (8, 24)):
        got = head_bytes(cfg, tokens, False, OURS.logits_bytes, elem, 0)
        assert got == tokens * cfg.vocab_size * per_logit + tokens * cfg.hidden_size * elem


def test_the_fused_heads_sums_take_the_accumulators_dtype():
    """The fused head (burst.engine.fused_loss) sums its weight gradient and softmax in the
    accumulators' dtype (fp32 for a bf16 model): the weight gradient's V x H counted at 4
    bytes, not the model's 2 (no test told them apart: a mutation audit)."""
    from burst.engine.configs import get_config
    from burst.engine.fused_loss import LOSS_CHUNK
    from burst.kernel import acc_dtype
    from suites.memory_model import head_bytes

    cfg = get_config("1b")
    v, h, tokens = cfg.vocab_size, cfg.hidden_size, 8192
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        elem, acc = dtype.itemsize, acc_dtype(dtype).itemsize
        assert head_bytes(cfg, tokens, True, elem=elem, weight_copies=0) == (
            LOSS_CHUNK * v * (elem + 2 * acc) + v * h * acc + tokens * h * elem), dtype


def test_attention_memory_matches_the_papers_benchmark_log(evals):
    """The counted attention-layer memory against max_memory_allocated in the paper's kernel
    benchmark log (calibrate.KERNEL_LOG_MIB, not fitted): within 30% for every logged cell, and
    no framework buffer (global_token_bytes) leaks into an attention layer alone."""
    rows = {(e["method"], e["seq_len"]): e for e in evals if e["table"] == "kernel"}
    assert len(calibrate.KERNEL_LOG_MIB) == 9
    for key, log in calibrate.KERNEL_LOG_MIB.items():
        assert rows[key]["mem_alloc_gib"] * 1024 == pytest.approx(log, rel=0.30), key
    lt = implementations()["loongtrain_double_ring"]
    assert lt.global_token_bytes > 0
    same = predict(as_cell(dict(workload="attention", method="double_ring", seq_len=1 << 19,
                                world=32, ranks_per_node=8, heads=40, head_dim=128,
                                options={"ranks_per_node": 8}, paper="loongtrain_double_ring")),
                   HW, lt.with_values(global_token_bytes=0.0))
    assert same.memory.allocated * 1024 / 2**30 == pytest.approx(
        rows[("loongtrain_double_ring", 1 << 19)]["mem_alloc_gib"] * 1024)


def test_the_vocabulary_choice_is_computed_not_typed(evals):
    """InternEvo's 14B vocabulary, chosen on the memory rows: what the other value (the
    repository's 32000) would give is computed (the README typed it by hand)."""
    fit = calibrate.Fit(HW, implementations(), [], evals)
    v = calibrate.vocab_choice(fit)
    by = {(label, ckpt): (paper, ours, alt) for label, world, ckpt, paper, ours, alt
          in v["memory"]}
    paper, ours, alt = by[("LoongTrain-Ring", "selective")]
    assert abs(ours / paper - 1) < 0.05 < 0.2 < abs(alt / paper - 1)  # only 120000 reaches it
    now, other = v["worst_memory_error"]
    assert other > now
    assert "with 32000" in calibrate.DOC.read_text()


def test_papers_second_kernel_measurement_is_reported_next_to_the_fit(evals):
    """The paper's benchmark log as a second measurement of the kernel cells
    (calibrate.KERNEL_LOG_TFLOPS, not fitted): every logged cell with a published number is
    compared, the differences are what the two tables say, and the section is in the doc."""
    reps = {(r["label"], r["seq_len"]): r for r in calibrate.kernel_repeats(evals)}
    assert len(reps) == len(calibrate.KERNEL_LOG_TFLOPS) == 11
    r = reps[("Megatron-CP", 1 << 18)]
    assert (r["published"], r["log"]) == (104.59, 71.98)
    assert r["log_vs_published"] == pytest.approx(71.98 / 104.59 - 1)
    assert r["sim_vs_log"] == pytest.approx(r["simulated"] / 71.98 - 1)
    from suites.simulator_doc import _repeat_lines

    doc = calibrate.DOC.read_text()
    assert "The paper's second measurement of the kernel cells" in doc
    (line,) = _repeat_lines(list(reps.values()))
    assert line in doc and line.count(" the published table orders ") == 3  # 128K-512K


def test_kernel_curve_matches_the_papers_profiled_calls():
    """eta(t) (fitted on end-to-end rows only) against the per-call flash-attention rates in
    the paper's two 512K profiles (calibrate.KERNEL_PROFILE): within 5% for both passes of
    both runs; and the profiled double ring loses its time outside the kernels, which run at
    BurstAttention's rate (the reason its attention_efficiency is not a kernel property)."""
    rates = calibrate.kernel_rates(HW)
    assert len(rates) == 4
    for r in rates:
        assert r["simulated"] == pytest.approx(r["profiled"], rel=0.05), r
    by = {(r["run"], r["pass"]): r["profiled"] for r in rates}
    burst, lt = "BurstAttention (fp16)", "LoongTrain-DoubleRing (bf16)"
    assert by[(lt, "backward")] == pytest.approx(by[(burst, "backward")], rel=0.02)
    share = {run: p["flash_s"] / calibrate.PROFILE_ITERATIONS / p["wall_s"]
             for run, p in calibrate.KERNEL_PROFILE.items()}
    assert share[lt] < share[burst] - 0.05
    assert "Kernel rate against the paper's profiles" in calibrate.DOC.read_text()


def test_attention_pairs_closed_form_equals_enumeration():
    """burst.flops.attention_pairs (closed form, so a 1M-token window costs nothing) against
    counting every visible (query, key) pair, for windows, causality and documents."""
    from burst.flops import attention_pairs

    def count(n, causal, window, cu=None):
        total = 0
        for a, b in zip(*(lambda c: (c[:-1], c[1:]))(cu or [0, n]), strict=True):
            for p in range(b - a):
                for j in range(b - a):
                    ok = (not causal or j <= p) and (window is None or
                                                     p - window[0] <= j <= p + window[1])
                    total += ok
        return total

    for n in (1, 2, 7, 33):
        for causal in (False, True):
            for w in (None, (0, 0), (1, 0), (3, 2), (0, 5), (40, 40), (100, 1)):
                assert attention_pairs(n, causal=causal, window=w) == count(n, causal, w)
    assert attention_pairs(60, causal=True, window=(4, 0), cu_seqlens=[0, 25, 60]) == count(
        60, True, (4, 0), [0, 25, 60])


def test_attn_tflops_counts_one_way_for_measured_and_simulated_rows():
    """burst.flops.attention_kernel_flops is the one formula for attn_tflops: the kernel
    convention (causal = half of N^2, backward = 2.5 x forward) and, with a window, the exact
    attended pairs, so a windowed simulated row reports the FLOPs a measured one does."""
    from burst import flops as F

    n, h, d = 4096, 4, 64
    assert F.attention_kernel_flops(1, n, h, d, True) == 3.5 * 4 * n * n / 2 * h * d
    win = (255, 0)
    exact = 3.5 * F.attention_flops(1, n, h, d, causal=True, window=win)
    assert F.attention_kernel_flops(1, n, h, d, True, win) == exact
    row = simulate_cell(dict(workload="attention", method="ring", seq_len=n, world=4,
                             heads=h, head_dim=d, window=win, causal=True), "a800")
    assert row["status"] == "ok"
    assert row["attn_tflops"] == pytest.approx(exact / row["time_s"] / 4 / 1e12)
    # a window that spans the sequence masks nothing: the FLOPs of no window (it was credited
    # N/2 pairs more, the exact causal count against the convention's N^2/2)
    for causal, span in ((True, (n - 1, 0)), (True, (n, 7)), (False, (n - 1, n - 1))):
        assert (F.attention_kernel_flops(1, n, h, d, causal, span)
                == F.attention_kernel_flops(1, n, h, d, causal))
    from burst.engine.configs import get_config

    for conv in F.CONVENTIONS:  # the model conventions too (dense counted it causal)
        assert (F.model_flops(get_config("tiny"), 1, n, conv, "full", (n - 1, 0))
                == F.model_flops(get_config("tiny"), 1, n, conv, "full")), conv
    assert F.attention_kernel_flops(1, n, h, d, False, (n - 1, n - 2)) == 3.5 * F.attention_flops(
        1, n, h, d, causal=False, window=(n - 1, n - 2))


def test_a_model_with_local_and_global_layers_is_priced_layer_by_layer():
    """Gemma-style layers (three local of 4096 tokens, then a global one): the step takes the
    layer-weighted mean of the uniform models' times, part by part, and the larger of their
    memories; its MFU counts each layer's pairs; an OOM window OOMs the model; the cell's
    per-layer window survives its JSON."""
    from burst import flops as F
    from burst.engine.configs import get_config
    from burst.masks import interleaved_windows
    from suites.cells import Cell

    n, cfg = 1 << 20, get_config("7b")
    b = dict(workload="train_step", method="burst", model="7b", seq_len=n, world=32, nodes=4,
             checkpointing="selective", fused_head=True, options={"layout": "zigzag"})
    w = interleaved_windows((4095, 0), cfg.num_layers, 4)
    mixed, local, whole = (predict({**b, "window": x}, HW) for x in (w, (4095, 0), None))
    assert mixed.status == local.status == whole.status == "ok"
    assert whole.time_s > 3 * mixed.time_s > 9 * local.time_s  # the global layers dominate
    assert mixed.time_s == pytest.approx((24 * local.time_s + 8 * whole.time_s) / 32)
    for k, v in mixed.parts.items():
        assert v == pytest.approx((24 * local.parts[k] + 8 * whole.parts[k]) / 32), k
    local_layers = tuple(i for i in range(32) if i % 4 != 3)
    assert mixed.memory.reserved == max(whole.memory.reserved, predict(
        {**b, "window": (4095, 0)}, HW, layers=local_layers).memory.reserved)
    # each window's memory on its own layers (the last local one is 30): the checkpoint of
    # layer 31 is freed by then: a USP cell the all-local model cannot fit, the mixed fits
    usp = dict(b, method="usp", options={"ulysses_degree": 8, "layout": "zigzag"},
               seq_len=2523136, data_parallel="fsdp_world")
    fits, not_local = (predict({**usp, "window": x}, HW) for x in (w, (4095, 0)))
    assert (fits.status, not_local.status) == ("ok", "oom")
    one = not_local.memory.parts["checkpoints"] / 32
    assert fits.memory.parts["checkpoints"] == pytest.approx(31 * one)
    assert fits.memory.parts["layer_backward"] == not_local.memory.parts["layer_backward"]
    # this project's engine: layer k holds the checkpoints of layers 0..k and the gradients
    # of those after it (whole; fsdp_world: their shards, fp32 here for bf16), so its first
    # layer can hold more than its last (a review's 1b cell, 16K tokens, full checkpointing)
    from suites.memory_model import _engine_moments

    for shards, grad in ((1, 3.0 * 2), (4, 3.0 * 4 / 4)):
        first, last = _engine_moments(cfg, 2, 100, 3.0, 320.0, 0.0, 0.0, shards)[1:3]
        assert (first["checkpoints"], last["checkpoints"]) == (10.0, 320.0)
        assert first["gradients"] - last["gradients"] == 31 * grad
    small = dict(workload="train_step", method="burst", model="1b", seq_len=1 << 14, world=1,
                 checkpointing="full", fused_head=True, options={"layout": "zigzag"})
    at = {k: predict(small, HW, layers=(k,)).memory for k in (0, 15)}
    assert at[0].reserved > at[15].reserved  # a layer's gradient outweighs its checkpoint
    assert predict(small, HW).memory.reserved == at[0].reserved
    row = simulate_cell({**b, "window": w}, HW)
    assert row["tflops_model_flops_causal"] * row["time_s"] * 32e12 == pytest.approx(
        F.model_flops(cfg, 1, n, "model_flops_causal", "selective", w))
    assert F.model_flops(cfg, 1, n, window=(4095, 0)) < F.model_flops(cfg, 1, n, window=w) \
        < F.model_flops(cfg, 1, n)
    long = {**b, "seq_len": 1 << 21}
    assert predict({**long, "window": w}, HW).status == predict(long, HW).status == "oom"
    cell = as_cell({**b, "window": w}, HW.gpus_per_node)
    assert Cell.from_json(cell.to_json()) == cell
    with pytest.raises(ValueError, match="a list of 32 entries, one per layer"):
        predict({**b, "window": w[:-1]}, HW)


def test_windowed_train_step_mfu_counts_the_window():
    """A windowed training step's MFU and TFLOP/s count the pairs the window computes, as its
    time does: its MFU was 3.98 (model FLOPs of full causal attention over the windowed time).
    A window that covers the sequence counts the causal step's FLOPs."""
    from burst import flops as F
    from burst.engine.configs import get_config

    n = 1 << 19
    b = dict(workload="train_step", method="burst", model="7b", world=8, ranks_per_node=8,
             seq_len=n, checkpointing="full", fused_head=True, dtype="bfloat16",
             paper="burstengine")
    win = simulate_cell({**b, "window": (4096, 0)}, HW)
    assert win["status"] == "ok"
    for conv in F.CONVENTIONS:  # no 16-bit work runs faster than its efficiency allows
        assert 0 < win[f"mfu_{conv}"] <= max(HW.gemm_efficiency, HW.fwd_eta_max), conv
    plain, whole = (simulate_cell({**b, "window": w}, HW) for w in (None, (n, 0)))

    def step_flops(r, conv):
        return r[f"tflops_{conv}"] * r["time_s"] * 8 * 1e12

    cfg = get_config("7b")
    for conv in ("model_flops_causal", "hardware_flops"):  # N(N+1)/2 against N^2/2 pairs
        assert step_flops(whole, conv) == pytest.approx(step_flops(plain, conv), rel=1e-5)
        assert step_flops(plain, conv) == pytest.approx(
            F.model_flops(cfg, 1, n, conv, checkpointing="full"))


def test_keys_of_the_other_workload_and_unknown_workloads_are_rejected():
    """What a spec rejects (suites.spec.ONLY_FOR) the Python API rejects too, naming the key and
    the workload: a train_step cell's causal=False or heads were silently replaced by its
    model's, an attention cell's checkpointing or model silently ignored; an unknown workload
    was an 'unknown model config None'. Default values ignore nothing and pass."""
    step = dict(workload="train_step", method="burst", model="7b", world=8, seq_len=1 << 16,
                paper="burstengine")
    attn = dict(workload="attention", method="burst", world=8, seq_len=1 << 16, heads=8,
                head_dim=64)
    for cell, key, workload in ((dict(step, causal=False), "causal", "train_step"),
                                (dict(step, heads=8, head_dim=64), "heads", "train_step"),
                                (dict(attn, checkpointing="full"), "checkpointing", "attention"),
                                (dict(attn, model="7b"), "model", "attention"),
                                (dict(attn, fused_head=True), "fused_head", "attention")):
        with pytest.raises(ValueError, match=f"{key}=.*not '{workload}'"):
            predict(cell, HW)
        with pytest.raises(ValueError, match=key):
            simulate_cell(cell, HW)
    with pytest.raises(ValueError, match="workload='inference'.*valid: attention, train_step"):
        predict(dict(attn, workload="inference"), HW)
    assert predict(dict(attn, checkpointing="none", fused_head=False), HW).status == "ok"
    assert predict(dict(step, causal=True, window=(1024, 0)), HW).status == "ok"


def test_a_cell_given_in_python_has_its_models_own_window():
    """A dict cell of a model with its own window (ministral-8b) was priced with no window at
    all: 165.8 tokens/s per GPU, against 470.1 for the spec's cell, which has the model's
    (found by a metamorphic audit). A second window for such a model is refused, as a spec and
    the Trainer refuse it."""
    from burst.engine.configs import get_config
    from suites.cells import expand
    from suites.spec import load_spec

    own = get_config("ministral-8b").window
    assert own is not None
    cell = dict(workload="train_step", method="burst", model="ministral-8b", seq_len=1 << 18,
                world=8, ranks_per_node=8, checkpointing="selective", fused_head=True)
    assert as_cell(cell).window == own == as_cell({**cell, "window": own}).window
    with pytest.raises(ValueError, match=r"model ministral-8b: window \[4095, 0\] on every "
                                         r"layer differs from the model's own \(global on 9 "):
        as_cell({**cell, "window": (4095, 0)})
    spec_cell = expand(load_spec("engine_ministral"))[0]
    assert spec_cell.window == own
    # a Cell made in Python (a spec's, replaced) follows the same rule
    assert as_cell(dataclasses.replace(spec_cell, window=None)).window == own
    assert as_cell(spec_cell) is spec_cell
    with pytest.raises(ValueError, match="differs from the model's own"):
        simulate_cell(dataclasses.replace(spec_cell, window=(4095, 0)), HW)
    mine = simulate_cell({**cell, **{k: getattr(spec_cell, k) for k in (
        "method", "options", "seq_len", "world", "nodes", "checkpointing", "fused_head",
        "dtype", "data_parallel", "label")}}, HW)
    theirs = simulate_cell(spec_cell, HW)
    assert mine["status"] == theirs["status"] == "ok"
    assert mine["time_s"] == theirs["time_s"] and mine["mem_peak_bytes"] == theirs["mem_peak_bytes"]


def test_windowed_attention_is_priced_by_the_same_tiles_for_every_method():
    """On one GPU every method runs the same tiled plan of a windowed sequence: Ulysses, TP and
    all-gather price it identically, the ring adds only its accumulator merges."""
    shape = dataclasses.replace(MHA, seq_len=1 << 16, window=(4096, 0))
    t = {m: attention_timing(HW, m, {"layout": "contiguous"} if m in ("burst", "allgather")
                             else {}, shape, Topo(1, 8))
         for m in ("ulysses", "tp", "allgather", "burst")}
    for m in ("tp", "allgather"):
        assert t[m].compute_forward_s == pytest.approx(t["ulysses"].compute_forward_s, rel=1e-12)
        assert t[m].compute_backward_s == pytest.approx(t["ulysses"].compute_backward_s,
                                                        rel=1e-12)
    assert 1 < t["burst"].compute_forward_s / t["ulysses"].compute_forward_s < 1.1
    # on 8 GPUs each Ulysses rank runs the same plan for 1/8 of the heads
    u8 = attention_timing(HW, "ulysses", {}, shape, Topo(8, 8))
    assert u8.compute_forward_s == pytest.approx(t["ulysses"].compute_forward_s / 8, rel=1e-12)


def test_a_masked_tile_costs_its_whole_rectangle():
    """A window's edge tile is one DENSE call (burst.masks), which burst.kernel runs on torch's
    memory-efficient kernel with the mask as a bias: it computes every pair of the rectangle,
    so a 1024-token block under a window costs what the unmasked block costs (it was priced on
    its visible pairs: 38% of it for a window of 511)."""
    for window in ((511, 0), (100, 0)):
        masked = dataclasses.replace(MHA, seq_len=1024, window=window)
        unmasked = dataclasses.replace(MHA, seq_len=1024, causal=False)
        t, u = (attention_timing(HW, "burst", {"layout": "contiguous"}, s, Topo(1, 8))
                for s in (masked, unmasked))
        assert t.compute_forward_s == pytest.approx(u.compute_forward_s, rel=1e-12)
        assert t.compute_backward_s == pytest.approx(u.compute_backward_s, rel=1e-12)


def test_windowed_ulysses_counts_its_fp32_gradient_accumulators():
    """A window tiles Ulysses' whole-sequence attention, whose calls merge into fp32 dq, dk, dv:
    the memory estimate grows by exactly those, and not without a window."""
    from suites.memory_model import FP32, attention_memory
    from suites.schedule import plan_for

    topo, windowed = Topo(8, 8), dataclasses.replace(MHA, window=(4096, 0))
    plain, win = (attention_memory(HW, s, plan_for("ulysses", {}, topo, s), 8)
                  for s in (MHA, windowed))
    n = MHA.seq_len // 8
    extra = MHA.batch * n * (MHA.heads + 2 * MHA.kv_heads) * MHA.head_dim * FP32
    assert win.allocated - plain.allocated == extra


def test_attention_layer_memory_parts_by_hand():
    """Each counted part of one attention layer, written out (a factor in one part moved no OOM
    verdict and no ordering: only the gates' stored snapshot noticed)."""
    from suites.memory_model import attention_memory
    from suites.schedule import plan_for

    shape = dataclasses.replace(MHA, kv_heads=8)  # GQA: q, out, dout, dq per query head
    parts = attention_memory(HW, shape, plan_for("burst", {}, TOPO, shape), 32).parts
    b, n, h, hk, d = 1, shape.seq_len // 32, 40, 8, 128
    assert parts["inputs_outputs"] == b * n * (2 * h + 2 * hk) * d * 2  # q, out; k, v (bf16)
    assert parts["grads"] == b * n * (2 * h + 2 * hk) * d * 2  # dout, dq; dk, dv
    assert parts["lse_delta"] == 2 * b * h * n * 4  # lse and D = rowsum(dO * O), fp32


def test_grad_acc_input_moves_and_holds_input_dtype_gradients():
    """grad_acc='input' (TransformerEngine's dK/dV in bf16) changes the prediction as the byte
    formula says: fewer backward bytes, no slower, smaller buffers; the option reached neither
    before (the simulator dropped it)."""
    from baselines import registry

    rows = {ga: simulate_cell(dict(workload="attention", method="zigzag_ring",
                                   options={"grad_acc": ga}, seq_len=131072, world=32,
                                   ranks_per_node=8, heads=32, head_dim=128, dtype="bfloat16"),
                              "a800") for ga in ("fp32", "input")}
    kw = dict(world=32, batch=1, seq_local=4096, heads=32, kv_heads=32, head_dim=128, elem=2)
    for ga, row in rows.items():
        want = registry.get("zigzag_ring").bytes(**kw, grad_acc=ga, node_size=8)
        assert row["bytes_sent_backward"] == want.sent("backward"), ga
    fp32, bf16 = rows["fp32"], rows["input"]
    assert bf16["bytes_sent_backward"] < 0.7 * fp32["bytes_sent_backward"]
    assert bf16["time_s"] <= fp32["time_s"] and bf16["mem_peak_bytes"] < fp32["mem_peak_bytes"]


def test_rows_count_every_option_the_cell_sets():
    """The simulator follows what a run of the cell would do: float64 accumulates in float64
    (bytes as the formula with 8-byte accumulators), selective_half's recomputed half forward
    moves bytes too, and a spec's layout is honoured for a paper system (its profile's layout
    is the default, not an override)."""
    from baselines import registry

    base = dict(workload="attention", method="burst", seq_len=4096, world=8, ranks_per_node=4,
                heads=8, head_dim=64, options={"backward": "burst", "layout": "zigzag"})
    row = simulate_cell(dict(base, dtype="float64"), "a800")
    want = registry.get("burst").bytes(world=8, batch=1, seq_local=512, heads=8, kv_heads=8,
                                       head_dim=64, elem=8, acc_elem=8, backward="burst",
                                       layout="zigzag", node_size=4, causal=True)
    assert row["bytes_sent_backward"] == want.sent("backward")
    train = dict(workload="train_step", method="burst", model="7b", seq_len=1 << 18, world=32,
                 ranks_per_node=8, dtype="bfloat16",
                 options={"layout": "striped", "backward": "burst", "ranks_per_node": 8})
    sel, half = (simulate_cell(dict(train, checkpointing=c), "a800")
                 for c in ("selective", "selective_half"))
    attn_half = simulate_cell(dict({k: v for k, v in train.items() if k != "model"},
                                   workload="attention", seq_len=1 << 17, heads=32,
                                   head_dim=128), "a800")
    layers = 32  # 7b
    assert half["bytes_sent_forward"] == sel["bytes_sent_forward"] + layers * attn_half[
        "bytes_sent_forward"]
    paper = dict(train, paper="burstengine", checkpointing="selective", fused_head=True)
    zig, stri = (simulate_cell(dict(paper, options=dict(paper["options"], layout=lay)), "a800")
                 for lay in ("zigzag", "striped"))
    assert zig["time_s"] != stri["time_s"]


def test_ulysses_buffers_hold_replicated_kv_heads():
    """Kv heads fewer than the Ulysses degree are replicated up to it before the all-to-all
    (burst.volume.ulysses_kv_heads), so the gathered buffers hold as many as with MHA."""
    from suites.memory_model import _attention_buffers
    from suites.schedule import plan_for

    topo = Topo(32, 8)
    for method, opts, degree in (("ulysses", {}, 32), ("usp", {"ulysses_degree": 8}, 8)):
        bufs = {}
        for kv in (1, degree):
            shape = AttnShape(batch=1, seq_len=1 << 17, heads=32, kv_heads=kv, head_dim=128)
            bufs[kv] = _attention_buffers(shape, plan_for(method, opts, topo, shape),
                                          topo.world, 4)
        assert bufs[1] == bufs[degree], method


def test_ulysses_selective_checkpointing_gathers_qkv_again_in_backward():
    """This project's engine does not keep Ulysses' post-all-to-all q, k, v, nor the layer's
    output, in the selective cache: it gathers them again and moves the kept kernel output back
    again in backward (burst/remake.py), so a selective row moves its forward all-to-alls'
    bytes once more per layer and takes their time, with a ring method's cache; a system that
    re-gathers nothing (the flag off) moves the bytes once."""
    from burst.volume import method_bytes

    cell = dict(workload="train_step", method="ulysses", model="7b", seq_len=1 << 18,
                world=32, ranks_per_node=8, dtype="bfloat16", checkpointing="selective",
                options={"layout": "contiguous"})
    lean = dataclasses.replace(ZERO3, selective_regathers=False)
    ours, other = (predict(as_cell(cell), HW, impl) for impl in (ZERO3, lean))
    tokens, layers = (1 << 18) // 32, 32
    assert ours.memory.parts["checkpoints"] == other.memory.parts["checkpoints"]
    # the 4 forward all-to-alls again, every layer (rank 0 is the busiest here)
    fwd = method_bytes("ulysses", world=32, batch=1, seq_local=tokens, heads=32, kv_heads=32,
                       head_dim=128, elem=2, node_size=8).sent("forward")
    assert simulate_cell(as_cell(cell), HW)["bytes_sent_forward"] == layers * fwd * 2
    assert (ours.parts["layers_backward"] - other.parts["layers_backward"]) > 0
    full = predict(as_cell(dict(cell, checkpointing="full")), HW, ZERO3)
    assert ours.time_s < full.time_s  # the all-to-alls again, not the attention
    # USP runs its all-to-alls in Ulysses groups of U (here one node's NVLink), and so does
    # its regather (priced over all 32 ranks, through the NICs: +4% on this step, an audit)
    usp = dict(cell, method="usp", seq_len=1 << 17, options={"ulysses_degree": 8})
    ours, other = (predict(as_cell(usp), HW, impl) for impl in (ZERO3, lean))
    again = collective_seconds(HW, ours.regather[0].sent("forward"), 8, Topo(32, 8))
    assert again < collective_seconds(HW, ours.regather[0].sent("forward"), 32, Topo(32, 8))
    assert (ours.parts["layers_backward"] - other.parts["layers_backward"]
            == pytest.approx(layers * again, rel=1e-9))


TRAIN_BYTE_CASES = [("ulysses", {}, "selective"), ("ulysses", {}, "full"),
                    ("usp", {"ulysses_degree": 2}, "selective"),
                    ("usp", {"ulysses_degree": 2, "backward": "burst"}, "full"),
                    ("burst", {"layout": "zigzag"}, "selective"),
                    ("burst", {"layout": "zigzag"}, "full"),
                    # a window on one layer of two: that layer's ring sends two hops each way
                    ("burst", {"layout": "zigzag"}, "full", ((7, 0), None))]


def _train_cell(method, options, checkpointing, window=None):
    return as_cell(dict(workload="train_step", model="tiny", seq_len=64, method=method,
                        options=options, checkpointing=checkpointing, window=window,
                        world=WORLD,
                        ranks_per_node=RPN,
                        device="cpu", dtype="float32", warmup=0, repeats=1,
                        profile_memory=False))


def _measure_train_cells(rank: int, world: int) -> list[dict]:
    from suites.measure import measure

    return [measure(_train_cell(*c)) for c in TRAIN_BYTE_CASES]


def test_simulated_training_bytes_equal_the_measured_ones():
    """A training step measured by the harness on WORLD gloo ranks (RPN per node) sends what its
    simulated row says, column by column (the maximum over ranks): every layer's attention,
    full checkpointing's recomputed forward, and selective Ulysses' and USP's forward
    all-to-alls run again in backward. Their selective cache holds one output and lse per
    layer, as a ring method's does and as the memory model counts."""
    from burst.engine.configs import get_config
    from suites.memory_model import checkpoint_bytes

    per_rank = _counted("train")
    cols = [f"bytes_sent_{c}" for c in ("forward", "backward", "intra", "inter")]
    saved = {}
    for i, case in enumerate(TRAIN_BYTE_CASES):
        assert all(r[i]["status"] == "ok" for r in per_rank), per_rank[0][i]["error"]
        got = [max(r[i][c] for r in per_rank) for c in cols]
        row = simulate_cell(_train_cell(*case), HW)
        assert got == [row[c] for c in cols], case
        saved[case[0], case[2]] = per_rank[0][i]["saved_bytes"]
    cfg, tokens = get_config("tiny"), 64 // WORLD  # one sequence of 64 tokens
    cache = cfg.num_layers * (checkpoint_bytes(cfg, tokens, "selective", 4)
                              - checkpoint_bytes(cfg, tokens, "full", 4))
    assert saved["burst", "selective"] - saved["burst", "full"] == cache
    assert saved["ulysses", "selective"] - saved["ulysses", "full"] == cache
    # USP keeps its ring's output and lse alone, as they do (its contiguous row order is the
    # identity: no index tensors since 82df81e); a kept q, k, v or layer output would add a
    # whole output's worth (MHA here)
    assert saved["usp", "selective"] - saved["usp", "full"] == cache


def test_gpu_packages_simulate_as_the_algorithms_they_run():
    """ring-flash-attn and yunchang (GPU-only packages) are simulated as the rings they run
    (they gave error rows: no schedule model), bytes as their own formulas."""
    from baselines import registry

    def row(method, opts):
        return simulate_cell(dict(workload="attention", method=method, options=opts,
                                  seq_len=131072, world=32, ranks_per_node=8, heads=32,
                                  head_dim=128, dtype="bfloat16"), "a800")

    for pkg, popts, ours, oopts in (("ring_flash_attn", {"layout": "zigzag"}, "zigzag_ring", {}),
                                    ("yunchang", {"ulysses_degree": 8}, "usp",
                                     {"ulysses_degree": 8, "layout": "contiguous"})):
        a, b = row(pkg, popts), row(ours, oopts)
        assert a["status"] == "ok", a["error"]
        want = registry.get(pkg).bytes(world=32, batch=1, seq_local=4096, heads=32, kv_heads=32,
                                       head_dim=128, elem=2, node_size=8, causal=True, **popts)
        assert a["bytes_sent_backward"] == want.sent("backward")
        assert (a["time_s"], a["mem_peak_bytes"]) == (b["time_s"], b["mem_peak_bytes"]), pkg


def test_ring_buffers_follow_the_heads_that_accumulate_locally():
    """The burst backward keeps dK, dV (kv heads) at home in fp32 and circulates Q-sized
    payloads; the ring backward keeps dQ (query heads) and circulates K/V-sized ones; float64
    accumulates in float64."""
    def buffers(method_opts, kv, dtype="bfloat16"):
        cell = dict(workload="attention", method="burst", seq_len=1 << 16, world=8, heads=32,
                    kv_heads=kv, head_dim=128, options=method_opts, dtype=dtype)
        return predict(cell, HW).memory.parts["comm_buffers"]

    b, n, d = 1, (1 << 16) // 8, 128
    burst = {"backward": "burst"}
    assert buffers(burst, 32) - buffers(burst, 8) == 2 * b * n * (32 - 8) * d * 4
    ring = {"backward": "ring"}
    # per kv head, K and V: two blocks (worked on, arriving; bf16) and three fp32 accumulators
    # of dK, dV (being filled, in flight out, in flight in), what burst.ring holds
    assert buffers(ring, 32) - buffers(ring, 8) == 2 * b * n * (32 - 8) * d * (2 * 2 + 3 * 4)
    # float64: the local dK, dV are float64 too
    assert buffers(burst, 32, "float64") - buffers(burst, 8, "float64") == \
        2 * b * n * (32 - 8) * d * 8


def test_input_dtype_accumulators_and_float64_scores_follow_the_dtype(tmp_path, capsys):
    """Megatron-CP's dK/dV travel in the input dtype: twice the bytes in float32, not the
    bf16 count; float64 runs the torch kernel backend, whose score matrices are memory; the
    CLI prints a float32 training row (it has no MFU)."""
    from suites.simulate import main

    cell = dict(workload="attention", method="zigzag_ring", seq_len=1 << 15, world=8,
                heads=8, head_dim=64, paper="megatron_cp")
    rows = {dt: simulate_cell({**cell, "dtype": dt}, HW) for dt in ("bfloat16", "float32")}
    assert rows["float32"]["bytes_sent_backward"] == 2 * rows["bfloat16"]["bytes_sent_backward"]
    ring = dict(cell, method="burst", paper=None, options={"backward": "burst"})
    p64 = predict({**ring, "dtype": "float64"}, HW)
    n = (1 << 15) // 8
    assert p64.memory.parts["float64_scores"] == 4 * 8 * n * n * 8
    # allgather's local queries meet the whole gathered sequence (not its own n keys: 8x less,
    # which passed a test audit); Ulysses' whole sequence meets itself for H / G heads
    for method, want in (("allgather", 4 * 8 * n * (1 << 15) * 8),
                         ("ulysses", 4 * 1 * (1 << 15) ** 2 * 8)):
        parts = predict({**cell, "method": method, "paper": None, "dtype": "float64"},
                        HW).memory.parts
        assert parts["float64_scores"] == want, (method, parts["float64_scores"], want)
    assert "float64_scores" not in predict({**ring, "dtype": "float32"}, HW).memory.parts
    spec = tmp_path / "fp32_train.toml"
    spec.write_text('description = "t"\nworkload = "train_step"\nmodel = "tiny"\n'
                    'device = "cuda"\ndtype = "float32"\nseq_lens = [4096]\nworld = 4\n'
                    '[[methods]]\nname = "burst"\n')
    assert main([str(spec), "--hardware", "a100", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    row = json.loads((tmp_path / "out" / "fp32_train" / "simulated-a100" / "rows.jsonl")
                     .read_text())
    # each ok line says its rate and the memory it reserves (the room left, for a planner), a
    # small cell's in MiB (it said "0.0 GiB")
    assert f"tokens/s per GPU, {row['mem_reserved_bytes'] / 2**20:.1f} MiB reserved" in out
    assert row["mem_reserved_bytes"] < 0.1 * 2**30


def test_holdout_summary_is_the_median_and_worst_absolute_error():
    from suites.calibrate import BURSTENGINE, holdout_summary

    ours = sorted(BURSTENGINE)[0]
    evals = [dict(method=m, rel_error=e) for m, e in
             ((ours, -0.1), ("megatron_cp", 0.2), (ours, 0.3), ("x", -0.4), ("x", None))]
    s = holdout_summary(evals)
    assert s["all"] == {"rows": 4, "median": pytest.approx(0.25), "worst": pytest.approx(0.4)}
    assert s["burstengine"] == {"rows": 2, "median": pytest.approx(0.2),
                                "worst": pytest.approx(0.3)}


def test_published_rows_time_and_fused_head_follow_the_table():
    """A published row's time is the step of one GPU's tokens (tokens/s is per GPU), so its
    MFU is a fraction near the paper's; BurstEngine's rows, ring and USP, use the fused head."""
    from results.paper import main_rows

    rows = [r for r in main_rows() if r.get("tokens_per_s")]
    assert rows
    for r in rows:
        assert r["time_s"] == pytest.approx(r["seq_len"] / (r["tokens_per_s"] * r["world"]))
        assert 0.1 < r["mfu_model_flops_causal"] < 0.8, r  # the paper: 19% to 60%
        assert r["fused_head"] == r["method"].startswith("burstengine"), r
    assert any(r["method"] == "burstengine_usp" and r["fused_head"] for r in rows)


def test_published_and_simulated_rows_count_the_recomputation_the_system_ran():
    """Deepspeed-Ulysses' and Megatron's 'selective' recompute whole layers: their simulated
    rows counted the hardware FLOPs of full recomputation, the published rows of the same
    cells those of selective (1.333 against 1.008 times the model FLOPs at 7B, 2M). Every
    published cell the simulator prices counts them alike on both sides."""
    from results.paper import main_rows

    priced = 0
    for r in main_rows():
        if not r.get("tokens_per_s"):
            continue
        s = simulate_cell(dict(workload="train_step", paper=r["method"], model=r["model"],
                               seq_len=r["seq_len"], world=r["world"], ranks_per_node=8,
                               checkpointing=r["checkpointing"], dtype="bfloat16", batch=1), HW)
        if s["status"] == "ok":
            priced += 1
            ratio = [x["tflops_hardware_flops"] / x["tflops_model_flops_causal"] for x in (r, s)]
            assert ratio[0] == pytest.approx(ratio[1], rel=1e-12), (r["label"], r["model"])
    assert priced == 24
    uly = next(r for r in main_rows() if r["label"] == "Deepspeed-Ulysses" and r["world"] == 32)
    assert uly["checkpointing"] == "selective"  # the row keeps the paper's label
    assert uly["tflops_hardware_flops"] / uly["tflops_model_flops_causal"] > 1.3



def test_a_profile_without_the_other_dtypes_peaks_still_prices_16_bit_cells(tmp_path):
    """A user's profile written before the float32/float64 peaks existed loads; its bf16 cells
    are priced as before, its float32 cells are error rows that name the missing value."""
    from suites.hardware import profile_path

    text = profile_path("a800").read_text().replace('name = "a800"', 'name = "old"')
    lines = [ln for ln in text.splitlines() if not ln.startswith(("peak_tf32", "peak_fp32",
                                                                   "peak_fp64"))]
    old = tmp_path / "old.toml"
    old.write_text("\n".join(lines) + "\n")
    cell = dict(workload="attention", method="burst", seq_len=1 << 16, world=8, heads=8,
                head_dim=128)
    assert simulate_cell(cell, load(old))["time_s"] == simulate_cell(cell, HW)["time_s"]
    row = simulate_cell({**cell, "dtype": "float32"}, load(old))
    assert row["status"] == "error" and "gpu.peak_tf32_tflops" in row["error"]
    # nor the host link of optimizer offload (it was a constant of the step model, PCIe 4.0
    # for every profile): only a cell that offloads needs it
    no_host = tmp_path / "no_host.toml"
    no_host.write_text("\n".join(ln for ln in lines if not ln.startswith(
        ("pcie_gbps", "cpu_adam_params_per_s"))) + "\n")
    step = dict(workload="train_step", model="7b", seq_len=1 << 18, world=32, ranks_per_node=8)
    plain = {**step, "method": "burst", "options": {"ranks_per_node": 8}}
    assert simulate_cell(plain, load(no_host))["time_s"] == simulate_cell(plain, HW)["time_s"]
    offload = {**step, "method": "double_ring", "options": {"ranks_per_node": 8},
               "paper": "loongtrain_double_ring"}
    assert simulate_cell(offload, HW)["status"] == "ok"
    row = simulate_cell(offload, load(no_host))
    assert row["status"] == "error" and "host.pcie_gbps" in row["error"], row["error"]
    assert load("h100").offload_seconds(1e9, 2) < HW.offload_seconds(1e9, 2)  # PCIe 5.0


def test_one_chip_is_priced_alike_in_its_two_profiles():
    """H100 and H200 are the same GH100 chip: a compute-bound attention layer costs the same on
    both, up to the H200's faster HBM (a planning audit found the H200 23% ahead at 4M tokens
    from assumed h100 kernel constants, 7% behind at 32K tokens a GPU)."""
    cell = dict(workload="attention", method="burst", world=32, seq_len=1 << 20, heads=32,
                head_dim=128, causal=True, options={"ranks_per_node": 8})
    h100, h200 = (simulate_cell(cell, hw)["time_s"] for hw in ("h100", "h200"))
    assert 1.0 <= h100 / h200 < 1.02, (h100, h200)


def test_what_the_simulator_does_not_model_is_an_error_not_a_guess():
    """Packed documents and the non-fused kernel backends were accepted and priced as if absent
    (the same time with 64 documents as with one; 'torch' backend scores never counted)."""
    big = 1 << 18
    base = dict(method="ring", seq_len=big, world=16, heads=32, head_dim=128)
    docs = simulate_cell(dict(base, options={"cu_seqlens": tuple(range(0, big + 1, big // 64))}),
                         "a800")
    assert docs["status"] == "error" and "packed documents are not a sweep" in docs["error"]
    row = simulate_cell(dict(base, options={"backend": "torch"}), "a800")
    assert row["status"] == "error" and "backend 'torch' is not modelled" in row["error"]
    row = simulate_cell(dict(base, options={"backend": "cpu_flash"}), "a800")  # cannot run at all
    assert row["status"] == "error" and "'cpu_flash' runs on the CPU, got CUDA" in row["error"]
    for backend in ("auto", "cuda_sdpa", "flash_attn"):
        assert simulate_cell(dict(base, options={"backend": backend}), "a800")["status"] == "ok"
    with pytest.raises(ValueError, match="world=12 does not fill nodes of 8 GPUs"):
        as_cell(dict(base, world=12, seq_len=12288), 8)


def test_step_breakdown_counts_the_recomputed_half_attention():
    hw = load("a800")
    cell = dict(workload="train_step", model="7b", method="burst", seq_len=1 << 17, world=32,
                options={"layout": "striped"})
    half = predict(dict(cell, checkpointing="selective_half"), hw)
    sel = predict(dict(cell, checkpointing="selective"), hw)
    assert half.status == sel.status == "ok"
    layers = 32
    again = half.parts["attention"] - sel.parts["attention"]
    assert again > 0
    assert again == pytest.approx(half.time_s - sel.time_s, rel=1e-9)  # all the extra time
    assert again / layers < sel.parts["attention"] / layers / 2


def test_a_published_cell_the_model_cannot_give_breaks_its_panel_and_the_check():
    """A published-ok cell predicted OOM used to drop out of its panel's ranking (and of every
    error statistic), so a model that failed it looked better."""
    def row(label, pub, sim, status="ok"):
        return dict(table="main", model="7b", world=32, seq_len=1 << 21, label=label,
                    published=pub, simulated=sim, status_paper="ok", status_sim=status,
                    rel_error=None if sim is None else sim / pub - 1, mem_rel_error=None)

    evals = [row("fast", 100.0, None, "oom"), row("slow", 50.0, 49.0)]
    (panel,) = calibrate.rankings(evals)
    assert panel["simulated"] == ["slow", "fast"] and not panel["preserved"]
    s = calibrate.summary(evals)
    assert s["ok_without_number"] == 1 and s["ok_predicted_oom"] == 1
    # a failing cell that is also last in the published order keeps the ranking
    (panel,) = calibrate.rankings([row("fast", 100.0, 99.0), row("slow", 50.0, None, "oom")])
    assert panel["preserved"]


def test_tied_embeddings_are_one_matrix_not_two_in_the_layers_share():
    """The per-layer parameter count took 2 x V x h off the total even when the head is tied to
    the embedding (one matrix), so a tied model's layers gathered V x h / L fewer weights."""
    from burst.engine import configs

    cell = dict(workload="train_step", model="7b", method="burst", seq_len=1 << 17, world=8,
                options={"layout": "zigzag"}, checkpointing="selective", fused_head=True)
    untied = predict(cell, HW, ZERO3)  # (fused: the peak is a layer's, which gathers weights)
    tied_cfg = dataclasses.replace(configs.get_config("7b"), tie_embeddings=True)
    tied = predict(dict(cell, model="7b-tied", model_config=tied_cfg), HW, ZERO3)
    assert tied.parts["state_collectives"] == pytest.approx(untied.parts["state_collectives"])
    assert tied.memory.parts["gathered_params"] == pytest.approx(
        untied.memory.parts["gathered_params"])


def test_the_console_shows_each_row_before_the_next_cell_and_a_gone_reader_loses_none(
        capsys, tmp_path, monkeypatch):
    """What a user sees: each row on the console before the next cell is priced; and with the
    reader gone (`| head`), the rows still reach --out (printed before they are written, a
    broken pipe lost them all: a review)."""
    import os
    import subprocess
    import sys

    import suites.simulate as S

    printed, priced = [], S.priced_cell

    def pricing(cell, *a, **kw):
        printed.append(capsys.readouterr().out.count(" TFLOP/s per GPU"))  # since the last
        return priced(cell, *a, **kw)

    monkeypatch.setattr(S, "priced_cell", pricing)
    assert S.main(["paper_kernel_32gpu"]) == 0
    assert printed == [0] + [1] * 15
    root = Path(__file__).resolve().parent.parent
    p = subprocess.Popen([sys.executable, "-m", "suites.simulate", "paper_kernel_32gpu", "--out",
                          str(tmp_path)], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(root)))
    p.stdout.close()  # the reader is gone before the first row
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0, err
    rows = tmp_path / "paper_kernel_32gpu" / "simulated-a800" / "rows.jsonl"
    assert len(rows.read_text().splitlines()) == 16, err


def test_cells_whose_fit_is_within_the_memory_models_error_are_named(capsys):
    """A cell predicted to fit with 0.06% to spare (LoongTrain-Ring, 7b, 2M tokens on 32 A800s:
    78.45 of 78.50 GiB) read as certain as one with 30% spare, although the memory model is
    off by 2.7% on the median published cell: the console names such cells, on either side."""
    from suites.calibrate import memory_error
    from suites.simulate import close_calls, main

    med, worst = memory_error()
    assert 0 < med <= worst < 1
    usable = 100 * 2**30
    rows = [dict(status=st, mem_reserved_bytes=f * usable)
            for st, f in (("oom", 1 + med / 2), ("ok", 1 - med / 2), ("ok", 1 - 2 * med),
                          ("oom", 1 + 2 * med), ("error", 1.0))] + [dict(status="ok")]
    assert [r["mem_reserved_bytes"] / usable for r in close_calls(rows, usable, med)] == [
        1 + med / 2, 1 - med / 2]
    assert main(["paper_main_7b", "--hardware", "a800"]) == 0
    note = [line for line in capsys.readouterr().out.splitlines() if "so whether they fit" in line]
    assert len(note) == 1 and "LoongTrain-Ring seq=2097152 world=32 (fits at 78.45 GiB)" in note[0]
    assert "Burst-Ring seq" not in note[0]  # 25 GiB to spare
    assert main(["paper_main_7b", "--hardware", "a800", "--headroom", "0.1"]) == 0
    assert "so whether they fit" not in capsys.readouterr().out  # priced with 10% to spare


def test_simulate_console_says_why_and_takes_one_profile(capsys, tmp_path):
    """A cell the simulator cannot price printed only its status (the reason was in rows.jsonl,
    written only with --out); a repeated --hardware silently kept the last profile."""
    from suites.simulate import main

    assert main(["paper_main_7b", "--hardware", "a800"]) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if " skipped" in line]
    assert skipped and all("skipped: " in line and "ulysses" in line for line in skipped)
    assert '"written": "nothing written (--out keeps the rows)"' in out  # it said nothing
    assert '"hardware": "a800"' in out  # the profile it priced on, also when defaulted
    cols = {line.index(" seq=") for line in out.splitlines()
            if " seq=" in line and not line.startswith("note:")}
    assert len(cols) == 1, cols  # "LoongTrain-Ring w/o sele-ckpt" ran into its length
    with pytest.raises(SystemExit) as ei:
        main(["paper_main_7b", "--hardware", "a800", "--hardware", "h100"])
    assert ei.value.code == 2 and "--hardware given more than once" in capsys.readouterr().err
    # an unmodelled method (a user's own) is an error row: the command now fails (it exited 0);
    # a CPU spec and an uncalibrated profile are said, not silently priced as measured ones
    assert main(["smoke", "--hardware", "h100"]) == 0  # (its kernel taken from the h200's)
    out = capsys.readouterr().out
    assert "h100 profile's attention-kernel efficiency is assumed" in out
    assert "note: smoke is a cpu spec; priced on h100 GPUs" in out
    assert main(["smoke", "--hardware", "a800"]) == 0
    assert "is assumed" not in capsys.readouterr().out  # a800 is calibrated
    mine = tmp_path / "mine.toml"
    mine.write_text('workload = "attention"\nseq_lens = [4096]\nworld = 4\ndevice = "cuda"\n'
                    '[shape]\nheads = 4\nhead_dim = 64\n[[methods]]\n'
                    'name = "tests.harness_methods:user_attention"\n')
    assert main([str(mine), "--hardware", "a800"]) == 1
    assert "has no schedule model" in capsys.readouterr().out


def test_a_spec_without_nodes_is_one_node_and_its_hint_names_spec_keys():
    """A spec's world without nodes is one node (as measured), a Python cell's is placed on the
    profile's nodes (docs/simulator.md says both); the error row of a spec's overfull node told
    it to set ranks_per_node, a key specs reject."""
    from suites.simulate import simulate_spec
    from suites.spec import parse_spec

    base = {"workload": "attention", "device": "cuda", "dtype": "bfloat16", "seq_lens": [1 << 16],
            "shape": {"heads": 8, "head_dim": 64}, "methods": [{"name": "burst"}]}
    (row,) = simulate_spec(parse_spec({**base, "world": 16}, name="w16"), HW)
    assert row["status"] == "error" and "a spec sets nodes or gpus_per_node" in row["error"]
    for scale in ({"world": 16, "nodes": 2}, {"nodes": 2, "gpus_per_node": 8}):  # the hint's
        (ok,) = simulate_spec(parse_spec({**base, **scale}, name="w16"), HW)  # keys, in a spec
        assert ok["status"] == "ok" and ok["nodes"] == 2, ok["error"]
    api = simulate_cell(dict(method="burst", seq_len=1 << 16, world=16, heads=8, head_dim=64), HW)
    assert api["status"] == "ok" and api["nodes"] == 2


def test_docs_list_as_modelled_only_what_a_cell_can_reach():
    """docs/simulator.md and the README listed TP among the modelled schedules ("Ulysses / TP:
    one rank holding the whole sequence"), while every tp cell is an error row; and stated no
    fixed per-kernel cost while tiny steps predict ~0.1 ms."""
    from pathlib import Path

    row = simulate_cell(dict(method="tp", seq_len=1 << 16, world=8, heads=32, head_dim=128), HW)
    assert row["status"] == "error" and "block-level" in row["error"]
    doc = calibrate.DOC.read_text()
    readme = (Path(calibrate.__file__).parents[1] / "README.md").read_text()
    assert "/ TP" not in doc and "a spec naming `tp` is refused" in doc
    assert "all-gather, TP," not in readme and "a spec naming `tp` is\nrefused" in readme
    tiny = simulate_cell(dict(method="burst", workload="train_step", model="tiny",
                              seq_len=4096, world=1), HW)
    assert tiny["time_s"] < 1e-3 and "no kernel launch" in doc


def test_a_method_without_a_simulated_number_ranks_last():
    """The documented rule (a cell the simulator gives no number cannot keep its panel's
    ranking by dropping out) had no test: ranking it first survived a mutation."""
    base = dict(table="main", model="7b", world=32, seq_len=1 << 21)
    evals = [dict(base, label="A", published=100.0, simulated=None),
             dict(base, label="B", published=90.0, simulated=95.0)]
    (panel,) = calibrate.rankings(evals)
    assert panel["published"] == ["A", "B"] and panel["simulated"] == ["B", "A"]
    assert panel["preserved"] is False


def test_yunchang_rings_are_not_truncated_by_a_window():
    """yunchang's ring (ring-flash-attn) runs every step whatever the window; our usp stops
    where the window ends. A window must not shorten yunchang's formula (it survived)."""
    from burst import volume

    kw = dict(world=8, batch=1, seq_local=4096, heads=8, kv_heads=8, head_dim=64, elem=2,
              ulysses_degree=2, layout="contiguous", causal=True, window=(1024, 0))
    full = dict(kw, window=None)
    yun, usp = (volume.method_bytes(m, **kw).sent() for m in ("yunchang", "usp"))
    assert yun == volume.method_bytes("yunchang", **full).sent() > usp


# ---------------------------------------------------------------------------------------------
# A user's own profile (new-user walkthrough)


def _guessed_kernel(text: str) -> str:
    """A profile's text with a kernel efficiency of one's own."""
    out = text.replace("fwd_eta_max = { value = 0.635,", "fwd_eta_max = { value = 0.5,")
    assert out != text
    return out


def _copy_profile(tmp_path, shipped: str, file: str, name: str | None = None, edit=None):
    """suites/hardware/<shipped>.toml copied to tmp_path/<file>, its name set to ``name`` (None:
    kept as shipped), ``edit`` (text -> text) applied."""
    from suites.hardware import profile_path

    text = profile_path(shipped).read_text()
    if name is not None:
        text = text.replace(f'name = "{shipped}"', f'name = "{name}"')
    path = tmp_path / file
    path.write_text(edit(text) if edit else text)
    return path


def test_a_copied_profile_cannot_pass_for_the_shipped_one(tmp_path, capsys):
    """A copy of h100.toml that kept `name = "h100"` wrote its rows as simulated-h100 with
    hardware=h100 (over the shipped predictions with --out results/simulated), its run.json
    recorded only the name, and the console note named suites/hardware/<name>.toml, a file that
    does not exist for a profile given as a path."""
    from results import store
    from suites.simulate import main, simulate_spec

    kept = _copy_profile(tmp_path, "h100", "mycluster.toml")
    with pytest.raises(ValueError, match="give it its own name") as ei:
        load(kept)
    assert str(kept) in str(ei.value) and "suites/hardware/h100.toml" in str(ei.value)
    assert main(["smoke", "--hardware", str(kept), "--out", str(tmp_path / "out")]) == 2
    assert "give it its own name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # no name key: the file's stem is the name, so /x/h100.toml is refused too
    stem = tmp_path / "stem"
    stem.mkdir()
    nameless = _copy_profile(stem, "h100", "h100.toml",
                             edit=lambda t: t.replace('name = "h100"\n', ""))
    with pytest.raises(ValueError, match="give it its own name"):
        load(nameless)
    assert load("h100").path == "suites/hardware/h100.toml"  # the shipped file loads
    # another case is the same folder on a case-insensitive disk; a "/" would make a path
    for name, says in (("H100", "give it its own name"), ("my/h100", "letters, digits")):
        odd = _copy_profile(tmp_path, "h100", "odd.toml",
                            edit=lambda t, n=name: t.replace('name = "h100"', f'name = "{n}"'))
        with pytest.raises(ValueError, match=says):
            load(odd)

    mine = _copy_profile(tmp_path, "h100", "mine.toml", "mycluster", edit=_guessed_kernel)
    hw = load(mine)
    assert hw.name == "mycluster" and hw.path == str(mine)
    assert main(["smoke", "--hardware", str(mine), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"its sources: {mine})" in out and "suites/hardware/mycluster.toml" not in out
    run = tmp_path / "out" / "smoke" / "simulated-mycluster"
    prov = store.read_meta(run)["hardware_profile"]
    assert prov == {"name": "mycluster", "path": str(mine), "values_sha256": hw.values_hash()}
    # the hash is of the values: another value, another hash; the same values, the same hash
    same = _copy_profile(tmp_path, "h100", "same.toml", "mycluster", edit=_guessed_kernel)
    assert load(same).values_hash() == hw.values_hash()
    assert hw.with_values(fwd_eta_max=0.55).values_hash() != hw.values_hash()
    # another file of the same name replaced mycluster's rows without a word (a CLI fuzz);
    # the same file, edited, replaces them
    rows_before = (run / store.ROWS).read_text()
    with pytest.raises(ValueError, match=f"from {mine}; this one is {same}"):
        simulate_spec("smoke", load(same), out_dir=tmp_path / "out")
    assert (run / store.ROWS).read_text() == rows_before
    mine.write_text(mine.read_text().replace("value = 0.5,", "value = 0.45,"))
    assert simulate_spec("smoke", load(mine), out_dir=tmp_path / "out")
    assert store.read_meta(run)["hardware_profile"]["values_sha256"] != hw.values_hash()
    shipped = simulate_spec("smoke", "h100", out_dir=tmp_path / "out")
    assert shipped and store.read_meta(tmp_path / "out" / "smoke" / "simulated-h100")[
        "hardware_profile"]["path"] == "suites/hardware/h100.toml"


def test_profile_errors_say_missing_unknown_and_not_found(tmp_path):
    """A missing key said "must be a table {value = ..., source = ...}", a misspelt key (a
    whole optional value gone unnoticed) was accepted, and a path that does not exist was an
    "unknown hardware profile"."""
    import re

    missing = _copy_profile(tmp_path, "h100", "missing.toml", "missing",
                            edit=lambda t: re.sub(r"^per_node = .*\n", "", t, flags=re.M))
    with pytest.raises(ValueError, match=re.escape("nic.per_node is missing")):
        load(missing)
    typo = _copy_profile(tmp_path, "h100", "typo.toml", "typo", edit=lambda t: t.replace(
        "pcie_gbps =", "pcie_gbs =").replace("[nvlink]", "[nvlinks]").replace(
        'per_node = { value = 8, source', 'per_node = { value = 8, sorce = "", source'))
    with pytest.raises(ValueError) as ei:
        load(typo)
    msg = str(ei.value)
    for part in ("host.pcie_gbs: unknown key (did you mean 'pcie_gbps'?)",
                 "nvlinks: unknown key (did you mean 'nvlink'?)",
                 "nic.per_node.sorce: unknown key (did you mean 'source'?)"):
        assert part in msg, msg
    with pytest.raises(ValueError, match="hardware profile file not found: '.*nope.toml'; "
                                         "shipped: a100, a800, h100, h200"):
        load(tmp_path / "nope.toml")
    with pytest.raises(ValueError, match="unknown hardware profile 'h10' "
                                         r"\(did you mean 'h100'\?\); shipped: a100"):
        load("h10")


def test_a_profile_file_with_a_value_in_another_unit_is_refused(tmp_path):
    """A NIC's bandwidth in bytes/s or a latency in seconds was priced as given: 1e9 times the
    bandwidth, a millionth of the latency, rows that looked like any others. A file's values must
    lie in their unit's range (which every shipped profile does); an idealised profile built in
    Python may still leave it, as tests here do to price a term alone."""
    import re

    from suites.hardware import names, profile_path

    text = profile_path("a800").read_text().replace('name = "a800"', 'name = "mine"')
    for pattern, repl, match in (
            (r"^(\[nic\](?:\n.*)*?\ngbps_per_direction = \{ value = )[0-9.]+", r"\g<1>25e9",
             "nic.gbps_per_direction=2.5e+10 is outside 0.01-100000 GB/s (1e9 bytes/s) per "
             "direction: is it in another unit?"),
            (r"^(\[nvlink\](?:\n.*)*?\nlatency_us = \{ value = )[0-9.]+", r"\g<1>10e-6",
             "nvlink.latency_us=1e-05 is outside 0.01-1e+06 microseconds"),
            (r"^(memory_gib = \{ value = )[0-9.]+", r"\g<1>85.2e9", "gpu.memory_gib=8.52e+10"),
            (r"^(peak_bf16_tflops = \{ value = )[0-9.]+", r"\g<1>312e12",
             "gpu.peak_bf16_tflops=3.12e+14 is outside 0.001-100000 TFLOP/s"),
            (r"^(gpus = \{ value = )8", r"\g<1>8000", "node.gpus=8000 is outside 1-1024")):
        new = re.sub(pattern, repl, text, count=1, flags=re.M)
        assert new != text, pattern
        (tmp_path / "mine.toml").write_text(new)
        with pytest.raises(ValueError, match=re.escape(match)):
            load(tmp_path / "mine.toml")
    # a value without a source is not a profile's (every value says where it comes from)
    no_source = re.sub(r'^(latency_us = \{ value = [0-9.]+, source = )"[^"]*"', r'\g<1>" "',
                       text, count=1, flags=re.M)
    assert no_source != text
    (tmp_path / "mine.toml").write_text(no_source)
    with pytest.raises(ValueError, match=re.escape("nvlink.latency_us: source=' ' must say")):
        load(tmp_path / "mine.toml")
    # an ideal link (latency 0) is a value in range, as are the shipped profiles'
    (tmp_path / "mine.toml").write_text(re.sub(r"^(latency_us = \{ value = )[0-9.]+", r"\g<1>0",
                                               text, count=1, flags=re.M))
    assert load(tmp_path / "mine.toml").nvlink_latency_us == 0
    assert all(load(n) for n in names())
    assert HW.with_values(peak_tflops=1e12).peak_tflops == 1e12


def test_a_profile_link_faster_than_any_is_warned_about(tmp_path):
    """The keys say ``gbps`` and links are sold in Gb/s or both ways at once: a 400 Gb/s NIC
    written as 400 priced every inter-node hop 8x too fast, with no word. Above the fastest
    link of its kind it loads with a warning that names the slip; at that link's rate it loads
    quietly, as every shipped profile does; the command line prints it as one line."""
    import os
    import subprocess
    import sys
    import warnings

    from suites.hardware import names, profile_path

    text = profile_path("h100").read_text().replace('name = "h100"', 'name = "mine"')
    for section, value, ok, slip in (("nic", 400, 100, 8), ("nvlink", 1800, 900, 2)):
        def write(v, section=section):
            new = re.sub(rf"^(\[{section}\](?:\n.*)*?\ngbps_per_direction = \{{ value = )"
                         r"[0-9.]+", rf"\g<1>{v}", text, count=1, flags=re.M)
            assert new != text
            (tmp_path / "mine.toml").write_text(new)

        write(value)
        with pytest.warns(UserWarning, match=re.escape(
                f"{section}.gbps_per_direction={value} is in GB/s (1e9 bytes/s) per direction, "
                "above the fastest of 2026")) as caught:
            load(tmp_path / "mine.toml")
        assert f"divide by {slip} if so" in str(caught[0].message)
        write(ok)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load(tmp_path / "mine.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(load(n) for n in names())
    write(400, "nic")  # the command (in a process of its own: pytest records warnings)
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", "import sys; from suites.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "simulate", "smoke", "--hardware",
                        str(tmp_path / "mine.toml")], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(root)), timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith(f"warning: hardware profile {tmp_path / 'mine.toml'}: "
                               "nic.gbps_per_direction=400 is in GB/s"), p.stderr


def test_hardware_values_must_be_finite():
    """An infinite bandwidth or peak priced every transfer or kernel at 0 s."""
    for name in ("hbm_gbps", "peak_tflops"):
        with pytest.raises(ValueError, match=f"{name}=inf must be a finite number >= 0"):
            HW.with_values(**{name: float("inf")})


@pytest.mark.parametrize(("change", "why"), [
    (dict(workload="train_step", model="tiny", heads=None, head_dim=None, fused_head="no"),
     "fused_head='no' (expected True or False)"),  # priced the fused head
    (dict(causal="false"), "causal='false' (expected True or False)"),
    (dict(ranks_per_node=8, nodes=1), "nodes=1 x ranks_per_node=8 is not world=32"),  # was
    (dict(ranks_per_node=8, nodes=32), "is not world=32"),  # overwritten with nodes=4
    (dict(kv_heads=-1), "kv_heads=-1 (expected an integer from 0 to 2**16)"),
    # ZeroDivisionError:
    (dict(world=0, ranks_per_node=8), "world=0 (expected an integer from 1 to 2**20)"),
    (dict(seq_len=-8), "seq_len=-8 (expected an integer from 1 to 2**40)"),  # hinted "e.g. 0"
    (dict(batch=2.5), "batch=2.5 (expected an integer from 1 to 2**31)"),
    # the spec's caps (an audit: seq_len=2**64, an OverflowError in numpy; world=2**62,
    # numpy's "array is too big")
    (dict(seq_len=2**64), f"seq_len={2**64} (expected an integer from 1 to 2**40)"),
    (dict(world=2**62), f"world={2**62} (expected an integer from 1 to 2**20)"),
    (dict(paper=["x"]), "unknown paper method ['x']"),  # (a TypeError: unhashable list)
])
def test_a_python_cell_with_a_bad_field_is_refused(change, why):
    """A cell given as a dict is checked as a spec's keys are: a switch that is not a bool, a
    count below its minimum, or nodes that contradict ranks_per_node is a ValueError, not a
    priced row (simulator audit: each of these came out as numbers). kv_heads=0 is as many
    as heads, as in a spec."""
    cell = dict(workload="attention", method="burst", seq_len=1 << 20, world=32, heads=32,
                head_dim=128) | change
    cell = {k: v for k, v in cell.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(why)):
        simulate_cell(cell, HW)
    mha = dict(workload="attention", method="burst", seq_len=1 << 16, world=8, heads=8,
               head_dim=64)
    assert simulate_cell(dict(mha, kv_heads=0), HW)["kv_heads"] == 8


def test_a_systems_defaults_yield_to_the_options_a_spec_sets():
    """Megatron-CP's input-dtype dK/dV is its paper option grad_acc="input", not a second
    profile constant that overrode a spec's grad_acc="fp32"; Burst-USP's burst ring backward
    is its default, priced in the time and in the bytes alike (the default went in under the
    key "ring", which the byte formula does not read)."""
    cell = dict(workload="attention", method="zigzag_ring", seq_len=1 << 15, world=8,
                heads=8, head_dim=64, paper="megatron_cp")
    b = {acc: simulate_cell(dict(cell, options={"grad_acc": acc}), HW)["bytes_sent_backward"]
         for acc in ("input", "fp32")}
    assert b["fp32"] > b["input"] == simulate_cell(cell, HW)["bytes_sent_backward"]
    usp = dict(workload="attention", method="usp", seq_len=1 << 17, world=16, heads=16,
               head_dim=64, paper="burstengine_usp", ranks_per_node=8)
    rows = {bw: simulate_cell(dict(usp, options={"ulysses_degree": 8, "layout": "zigzag",
                                                 **({"backward": bw} if bw else {})}), HW)
            for bw in (None, "burst", "ring")}
    keys = ("time_s", "bytes_sent_forward", "bytes_sent_backward")
    assert [rows[None][k] for k in keys] == [rows["burst"][k] for k in keys]
    assert rows["ring"]["bytes_sent_backward"] != rows["burst"]["bytes_sent_backward"]


def test_a_spec_placed_on_other_nodes_keeps_its_world(capsys, tmp_path):
    """`simulate --gpus-per-node N` (SweepSpec.on_nodes_of): the same world on nodes of N, the
    options tied to the node follow it, and the rows go to a sweep of their own."""
    import json

    from suites.simulate import main, simulate_spec
    from suites.spec import SpecError, load_spec

    spec = load_spec("paper_kernel_32gpu")
    four = spec.on_nodes_of(4)
    assert four.name == "paper_kernel_32gpu-4gpn"
    assert [(s.nodes, s.ranks_per_node, s.seq_lens) for s in four.scales] == [
        (8, 4, spec.scales[0].seq_lens)]
    rows = {(r["label"], r["seq_len"]): r for r in simulate_spec(four, "a800")}
    opts = {label: json.loads(r["method_options"]) for (label, _), r in rows.items()}
    assert opts["BurstAttention"]["ranks_per_node"] == 4  # "@node"
    assert opts["LoongTrain-USP"]["ulysses_degree"] == 4  # "@node"
    assert opts["LoongTrain-DoubleRing"]["ranks_per_node"] == 8  # "@world/4": its inner ring
    assert all((r["nodes"], r["ranks_per_node"], r["world"]) == (8, 4, 32) for r in rows.values())
    # its inner ring of 8 now crosses a node boundary: slower than on nodes of 8
    eight = {(r["label"], r["seq_len"]): r for r in simulate_spec(spec, "a800")}
    key = ("LoongTrain-DoubleRing", 131072)
    assert rows[key]["time_s"] > eight[key]["time_s"]
    assert spec.on_nodes_of(64).scales[0].ranks_per_node == 32  # one node of the whole world
    with pytest.raises(SpecError, match="world 32 does not split into nodes of 3 GPUs"):
        spec.on_nodes_of(3)
    assert main(["paper_kernel_32gpu", "--gpus-per-node", "4", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "paper_kernel_32gpu-4gpn" / "simulated-a800" / "rows.jsonl").exists()
    assert main(["paper_kernel_32gpu", "--gpus-per-node", "3"]) == 2
    # the sizes it offers are those the profile's nodes hold (it listed 16 and 32 on a800)
    assert "does not split into nodes of 3 GPUs; valid: 1, 2, 4, 8\n" in capsys.readouterr().err
    # more GPUs per node than the profile's nodes have: refused once, not an error row per cell
    (tmp_path / "file").write_text("")
    for argv, why in ((["--gpus-per-node", "16"], "the a800 profile has 8 GPUs per node"),
                      (["--out", str(tmp_path / "file")], "is a file, not a folder")):
        with pytest.raises(SystemExit) as e:
            main(["paper_kernel_32gpu", *argv])
        assert e.value.code == 2 and why in capsys.readouterr().err
    # a spec's own scale so: refused before any cell is priced (it was an error row per cell)
    wide = tmp_path / "wide.toml"
    wide.write_text('workload = "attention"\nseq_lens = [65536]\n[shape]\nheads = 8\n'
                    'head_dim = 64\n[[scales]]\nnodes = 1\ngpus_per_node = 16\n'
                    '[[scales]]\nnodes = 1\ngpus_per_node = 8\n'  # the widest counts
                    '[[methods]]\nname = "ring"\n')
    assert main([str(wide), "--out", str(tmp_path / "w")]) == 2
    assert "a scale places 16 GPUs on a node, but the a800 profile's nodes have 8; " \
           "--gpus-per-node 8 places the same world on them" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    assert main([str(wide), "--gpus-per-node", "8"]) == 0


@pytest.mark.parametrize("argv", [["--check", "--write"], ["--hardware", "h100"],
                                  ["--check", "--crossval"], ["--crossval", "--jobs", "0"]])
def test_calibrate_refuses_what_would_overwrite_the_fit_wrongly(argv, capsys):
    """The paper's tables calibrate the a800 profile only (fitting another GPU's profile on them
    rewrote the committed fit), and --check never writes, so --check --write (or --crossval,
    which refits) is refused, not half obeyed; all before any fit runs."""
    with pytest.raises(SystemExit) as e:
        calibrate.main(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_causal_call_never_costs_more_than_the_same_call_unmasked():
    """A causal block computes its diagonal tiles whole, t(t+b)/2 pairs of work; below one tile
    (t < b) that was more than the t^2 of the whole block, so a causal call of 64 tokens was
    priced 1.3x the unmasked one (16 tokens: 4.5x) and striped layouts with a few tokens per
    rank lost to contiguous ones."""
    for n in (8, 16, 32, 64, 96, 128, 256, 4096):
        c = dict(workload="attention", method="burst", seq_len=n, world=1, heads=32,
                 head_dim=128)
        causal, full = (simulate_cell(dict(c, causal=m), "a800")["time_s"] for m in (True, False))
        assert causal <= full * (1 + 1e-12), (n, causal / full)
    for t in (1, 2, 50, 127, 128, 129, 1000):  # the useful fraction of a causal call's work
        assert HW.attn_efficiency(t, causal=True) <= HW.attn_efficiency(t) * (1 + 1e-12), t


def test_a_train_step_the_trainer_refuses_is_not_priced():
    """What burst.engine.Trainer refuses is not a price: float16 (no loss scaling), and
    selective_half on an odd local length (it halves each rank's tokens). Both were ok rows
    through the Python API."""
    step = dict(workload="train_step", method="burst", model="tiny", world=8, ranks_per_node=8,
                options={"layout": "striped"})
    fp16 = predict(dict(step, seq_len=64, dtype="float16"), HW)
    assert fp16.status == "error" and "float16 would need loss scaling" in fp16.error
    odd = predict(dict(step, seq_len=8 * 37, checkpointing="selective_half"), HW)
    assert odd.status == "error" and "local length 37 is odd" in odd.error
    assert predict(dict(step, seq_len=8 * 38, checkpointing="selective_half"), HW).status == "ok"


def test_the_engines_fsdp_world_shards_its_states_over_every_rank():
    """A cell with data_parallel="fsdp_world" (burst.engine.parallel: FSDP over every rank, one
    unit per decoder layer and a root unit) holds 1/G of the weights and moments at rest, in
    fp32 for a bf16 model (master weights), the root unit (embedding, head) gathered for the
    step and, in the last layer's backward, two layers' weights and one layer's gradients
    (ZeRO-3's per-layer gathers, in bf16), the fp32 buffer its reduce-scatter copies them into,
    and the head's gradient; it moves ZeRO-3's bytes (a
    bf16 gather per layer in the forward, another and an fp32 reduce-scatter in the backward)
    and the root's, and steps 1/G of an fp32 optimizer. A paper system's cell cannot ask for
    it."""
    from burst.engine.configs import get_config, param_count, vocab_params

    cfg = get_config("7b")
    params, vocab = param_count(cfg), vocab_params(cfg)
    layer = (params - vocab) / cfg.num_layers
    cell = as_cell(dict(workload="train_step", method="burst", model="7b", seq_len=1 << 17,
                        world=8, ranks_per_node=8, checkpointing="full", fused_head=True))
    ddp = predict(cell, HW)
    world = predict(dataclasses.replace(cell, data_parallel="fsdp_world"), HW)
    # 16K tokens per rank: the last layer's backward is the peak
    parts = world.memory.parts
    assert parts["model_states"] == 3 * 4 * params / 8  # fp32 weights and moments
    assert parts["gathered_params"] == 2 * vocab + 3 * 2 * layer
    assert parts["gradients"] == cfg.vocab_size * cfg.hidden_size * 2
    assert parts["reduce_scatter"] == 4 * layer  # FSDP copies a layer's gradients into fp32
    assert set(parts) == {"model_states", "gathered_params", "gradients", "reduce_scatter",
                          "checkpoints", "layer_backward"}
    assert world.memory.reserved < 0.5 * ddp.memory.reserved
    # 4K tokens per rank: the first layer's backward, which holds one layer's checkpoint and
    # the fp32 gradient shards of the 31 layers after it (FSDP reduce-scatters each layer's
    # gradients into its shard as its backward ends)
    first = predict(dataclasses.replace(cell, seq_len=1 << 15, data_parallel="fsdp_world"), HW)
    assert first.memory.parts["gradients"] == pytest.approx(
        cfg.vocab_size * cfg.hidden_size * 2 + 31 * 4 * layer / 8)
    assert first.memory.parts["checkpoints"] == parts["checkpoints"] / 4 / 32  # 1/4 the tokens
    # 2K tokens per rank: the optimizer step, with foreach AdamW's fp32 sqrt(v) of its shard
    short = predict(dataclasses.replace(cell, seq_len=1 << 14, data_parallel="fsdp_world"), HW)
    assert short.memory.parts == {"model_states": 16 * params / 8,
                                  "optimizer_step": 4 * params / 8}
    # ZeRO-3 moves the layers' weights twice in bf16 (gather, gather again) and their
    # gradients once in fp32 (reduce-scatter), where an all-reduce moves 2 bf16 copies; the
    # root unit moves one of each (the 98 collectives' latencies add ~1%)
    ratio = ((params - vocab) * (2 + 2 + 4) + vocab * (2 + 4)) / (2 * 2 * params)
    assert world.parts["state_collectives"] == pytest.approx(
        ratio * ddp.parts["state_collectives"], rel=0.02)
    # 1/8 of the parameters, each with 16 bytes of fp32 states to read and write, not 8
    assert world.parts["optimizer"] == pytest.approx(ddp.parts["optimizer"] / 8 * 2)
    # the layers' collectives hide behind their compute here; the root's do not
    assert world.time_s < ddp.time_s
    paper = dict(workload="train_step", model="7b", seq_len=1 << 15, world=8, method="burst",
                 paper="burstengine", data_parallel="fsdp_world")
    assert predict(paper, HW).error.startswith("data_parallel='fsdp_world' is this project's")
    assert predict(dict(paper, data_parallel=None), HW).status == "ok"


def test_a_cell_keeps_its_id_unless_it_names_a_data_parallel():
    """The stored runs' cell ids are those the specs expand to now (the data_parallel field
    joined the id only where a method sets it)."""
    import json
    from pathlib import Path

    from suites.cells import expand
    from suites.spec import load_spec

    root = Path(__file__).resolve().parent.parent / "results" / "simulated"
    for run in sorted(root.glob("*/simulated-a800/run.json")):
        meta = json.loads(run.read_text())
        assert meta["cells"] == [c.cell_id for c in expand(load_spec(meta["sweep"]))], run
    c = expand(load_spec("engine_7b"))
    assert len({x.cell_id for x in c}) == 3 and c[2].data_parallel == "fsdp_world"
    assert dataclasses.replace(c[2], data_parallel=None).cell_id != c[2].cell_id


def test_an_own_model_is_priced_as_the_built_in_config_of_the_same_fields(tmp_path):
    """A model the spec (or a dict cell) defines itself, here llama3-8b's fields under another
    name, is priced exactly as the named config: time, memory, bytes and FLOP rates; its rows
    differ in the model's name and the cells' ids alone. The shipped spec of one
    (engine_own_model) keeps the rows it wrote."""
    from burst.engine.configs import get_config
    from suites.cells import expand
    from suites.simulate import simulate_spec
    from suites.spec import load_spec

    fields = dataclasses.asdict(get_config("llama3-8b"))
    table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items() if v is not None)
    head = ('workload = "train_step"\nmodel = "NAME"\ndevice = "cuda"\ndtype = "bfloat16"\n'
            'seq_lens = [262144, 1048576]\nnodes = 4\ngpus_per_node = 8\n'
            '[[methods]]\nname = "burst"\ncheckpointing = "selective"\nfused_head = true\n'
            'data_parallel = "fsdp_world"\n[[methods]]\nname = "usp"\n'
            'options = { ulysses_degree = 8 }\ncheckpointing = "full"\n'
            'data_parallel = "fsdp_world"\n')
    (tmp_path / "own.toml").write_text(head.replace("NAME", "mine") + "[model_config]\n" + table)
    (tmp_path / "named.toml").write_text(head.replace("NAME", "llama3-8b"))
    own, named = (simulate_spec(tmp_path / f"{n}.toml", HW) for n in ("own", "named"))
    differ = {k for a, b in zip(own, named, strict=True) for k in a if a[k] != b[k]}
    assert differ - {"date"} == {"model", "cell_id", "spec", "sweep", "sweep_spec"}, differ
    assert {r["status"] for r in own} == {"ok"} and {r["model"] for r in own} == {"mine"}
    # a dict cell: the config itself, or its fields
    base = dict(workload="train_step", method="burst", seq_len=2**20, world=32,
                checkpointing="selective", fused_head=True, data_parallel="fsdp_world")
    want = simulate_cell({**base, "model": "llama3-8b"}, HW)
    for given in (get_config("llama3-8b"), fields):
        got = simulate_cell({**base, "model": "mine", "model_config": given}, HW)
        assert (got["time_s"], got["mem_reserved_bytes"], got["bytes_sent_backward"]) == (
            want["time_s"], want["mem_reserved_bytes"], want["bytes_sent_backward"])
    bad = [({"model": "7b", "model_config": fields}, "model='7b' is a built-in config"),
           ({"model": "m", "model_config": {"hidden_size": 64}},
            "model_config: missing num_layers, num_heads, num_kv_heads, ffn_size, vocab_size"),
           ({"model": "m", "model_config": {"hidden_size": 64, "layers": 2}},
            "model_config: unknown field 'layers'; valid: hidden_size, num_layers"),
           ({"model": "m", "model_config": [1]},
            "model_config: [1] is of type list; expected a table of the model's fields")]
    for extra, why in bad:
        with pytest.raises(ValueError, match=re.escape(why)):
            simulate_cell({**base, **extra}, HW)
    # a spec's cell given another model in Python (dataclasses.replace) is that model's cell:
    # its heads and kv heads, not the spec's (a review: the row named 8 kv heads, 16 priced)
    cell = expand(load_spec(tmp_path / "own.toml"))[0]
    other = dataclasses.replace(get_config("llama3-8b"), num_kv_heads=16)
    moved = as_cell(dataclasses.replace(cell, model_config=other))
    assert moved.kv_heads == 16 and moved.model_config == dataclasses.asdict(other)
    assert as_cell(cell) is cell  # a spec's own cell is kept as it is
    with pytest.raises(ValueError, match="model='7b' is a built-in config"):
        as_cell(dataclasses.replace(cell, model="7b"))
    # the shipped spec's committed rows are those it gives now
    spec = load_spec("engine_own_model")
    assert spec.model_config["num_kv_heads"] == 8 and spec.model == "codellama-34b"
    stored = Path(__file__).resolve().parent.parent / "results" / "simulated"
    rows = [json.loads(x) for x in (stored / "engine_own_model/simulated-a800/rows.jsonl"
                                    ).read_text().splitlines()]
    now = simulate_spec("engine_own_model", HW)
    assert [r["cell_id"] for r in rows] == [c.cell_id for c in expand(spec)]
    assert [(r["tokens_per_s"], r["mem_reserved_bytes"]) for r in rows] == [
        (r["tokens_per_s"], r["mem_reserved_bytes"]) for r in now]


def test_a_model_at_the_size_caps_is_an_oom_row_in_a_written_table(tmp_path):
    """A spec's model at ModelConfig's caps (widths and vocabulary of 2**40) is priced (in well
    under a second: the heads' check listed 2**39 divisors by counting) as an OOM row whose
    byte count passes int64, and its run's table is written, the count a float there and
    exact in rows.jsonl (parquet's OverflowError broke the table after the rows)."""
    import pandas as pd

    from suites.simulate import simulate_spec

    big = 2**40
    (tmp_path / "huge.toml").write_text(
        'workload = "train_step"\nmodel = "huge"\ndevice = "cuda"\ndtype = "bfloat16"\n'
        'seq_lens = [65536]\nnodes = 1\ngpus_per_node = 8\n[[methods]]\nname = "ulysses"\n'
        f"[model_config]\nhidden_size = {big}\nnum_layers = 4\nnum_heads = {big // 2}\n"
        f"num_kv_heads = {big // 2}\nffn_size = {big}\nvocab_size = {big}\n")
    rows = simulate_spec(tmp_path / "huge.toml", HW, out_dir=tmp_path)
    assert [r["status"] for r in rows] == ["oom"] and rows[0]["mem_peak_bytes"] >= 2**63
    run = tmp_path / "huge" / f"simulated-{HW.name}"
    table = pd.read_parquet(run / "table.parquet")
    assert table["mem_peak_bytes"].tolist() == [float(rows[0]["mem_peak_bytes"])]
    assert json.loads((run / "rows.jsonl").read_text())["mem_peak_bytes"] == rows[0][
        "mem_peak_bytes"]


def test_a_windowed_cell_past_the_planning_cap_says_so_and_still_says_oom(monkeypatch):
    """A windowed cell's time plans its kernel tiles per token (about 80 bytes and 0.8 us a
    token a side), so a tiny model that never runs out of GPU memory exhausted the host's at
    2**28 tokens a rank. Past ``MAX_PLANNED_TOKENS`` a side (the cap lowered here) such a cell
    is an error row that says why and how to get a time, without planning anything; one that
    does not fit is still an OOM row; the plain mask, priced without plans, is not capped. The
    side is the ring's block (USP's: U ranks' tokens) and Ulysses' whole sequence."""
    import burst.masks as M
    import suites.schedule as S

    monkeypatch.setattr(S, "MAX_PLANNED_TOKENS", 4096)
    planned = []
    real = M.plan_pair
    monkeypatch.setattr(S, "plan_pair", lambda *a: planned.append(a[-1]) or real(*a))
    S._pair_calls.cache_clear()
    tiny = dict(workload="attention", world=8, ranks_per_node=8, heads=8, kv_heads=8,
                head_dim=2, dtype="bfloat16", causal=True, window=(1024, 0))
    for method, opts, side in [("zigzag_ring", {}, 1024), ("usp", {"ulysses_degree": 2}, 2048),
                               ("ulysses", {}, 8192)]:
        at = dict(tiny, method=method, options=opts)
        row = simulate_cell(dict(at, seq_len=8 * 8192 * 1024 // side), HW)
        assert row["status"] == "error" and row.get("time_s") is None, (method, row)
        assert "here 8192 tokens a side, past the simulator's 4096" in row["error"], row
        assert "or more ranks" in row["error"] if method != "ulysses" else \
            "a shorter sequence is priced" in row["error"]
        assert planned == [] and row["mem_peak_bytes"] > 0  # refused before any plan
        ok = simulate_cell(dict(at, seq_len=8 * 4096 * 1024 // side), HW)  # at the cap
        assert ok["status"] == "ok" and ok["time_s"] > 0 and max(planned) == 4096, method
        plain = simulate_cell(dict(at, seq_len=8 * 8192 * 1024 // side, window=None), HW)
        assert plain["status"] == "ok" and plain["time_s"] > 0, method
        planned.clear()
    huge = dict(tiny, method="zigzag_ring", heads=64, kv_heads=64, head_dim=128,
                seq_len=2**30)
    p = predict(huge, HW)  # past the cap and out of memory: an OOM, and why
    assert p.status == "oom" and "GiB usable" in p.error and planned == []
    assert explain(p) == ""  # (it read the attention's time, which was never priced)
    # a model of local and global layers: its local layers' cap decides; an OOM stays one
    # (a step whose global layers were priced and local ones not mixed their parts: KeyError)
    from suites.cells import expand
    from suites.spec import load_spec

    for c in expand(load_spec("engine_local_global")):
        for seq, status in ((2**20, "error"), (2**22, "oom")):
            p = predict(dataclasses.replace(c, seq_len=seq), HW)
            assert p.status == status and explain(p) == "", (c.label, seq)
            assert status == "oom" or "tokens a side, past the simulator's 4096" in p.error


def test_a_ring_sending_both_ways_across_nodes_is_priced_by_its_nic_bytes():
    """A window whose keys lie on both sides sends a zigzag ring both ways. Where a node holds
    one member of the ring (a node per rank, or USP's groups as large as a node), that GPU sends
    both ways through its share of the NICs, so the layer takes at least its inter-node bytes
    over that share. A review found the two directions priced as if they never shared a NIC:
    up to 2x too fast. (Where a node holds several members, the GPUs that cross depend on the
    step: test_each_hop_crosses_nodes_from_the_gpus_whose_targets_lie_on_another_node.)"""
    from burst.masks import MaskSpec, ring_reach

    base = dict(workload="attention", seq_len=2**21, world=32, heads=32, kv_heads=8,
                head_dim=128, dtype="bfloat16", causal=True, window=(4096, 0))
    # (method, ranks per node, options, ring members, GPUs of a node crossing each way)
    cases = [("burst", 1, dict(layout="zigzag", backward="burst"), 32, 1),
             ("usp", 8, dict(ulysses_degree=8, layout="zigzag", backward="burst"), 4, 8)]
    for method, rpn, opts, members, senders in cases:
        m = base["seq_len"] // members
        assert ring_reach(MaskSpec(causal=True, window=base["window"]), "zigzag", members,
                          m) == (1, 1)
        row = simulate_cell(dict(base, method=method, ranks_per_node=rpn, options=opts), HW)
        assert row["status"] == "ok", row["error"]
        assert rpn * members // base["world"] == 1  # one ring member on each node
        floor = row["bytes_sent_inter"] / (HW.inter_gbps(senders) * 1e9)
        assert row["time_s"] >= floor, (method, opts, row["time_s"], floor)


# (method, options, world, ranks per node, layout, causal, window, ring members, reach)
CROSSING_CASES = {
    # a flat ring of 16 on nodes of 8, 8 steps back
    "one way, 8 back": ("burst", {}, 16, 8, "contiguous", True, (8 * 8192, 0), 16, (8, 0)),
    # zigzag on nodes of 2: both GPUs send both sums across
    "both ways, 2 each": ("burst", {}, 16, 2, "zigzag", True, (8192, 0), 16, (2, 2)),
    # a two-sided window on nodes of 4: 2 steps one way, 1 the other
    "2 one way, 1 the other": ("burst", {}, 16, 4, "contiguous", False, (2 * 8192, 8192), 16,
                               (2, 1)),
    # USP: rings of 8 over 4 nodes (2 members a node, 4 rings side by side)
    "usp, U 4 on nodes of 8": ("usp", {"ulysses_degree": 4}, 32, 8, "zigzag", True, (4096, 0),
                               8, (1, 1)),
    # USP whose groups straddle nodes: ring j holds ranks j, j + 4, ..., nodes hold 6 ranks
    "usp, U 4 on nodes of 6": ("usp", {"ulysses_degree": 4}, 24, 6, "zigzag", True, (4096, 0),
                               6, (1, 1)),
}


@pytest.mark.parametrize("case", list(CROSSING_CASES))
def test_each_hop_crosses_nodes_from_the_gpus_whose_targets_lie_on_another_node(case):
    """With free compute and no latency, a shortened flat ring across nodes takes each step's
    bytes through the NIC share of the GPUs that cross in that step. A regular hop crosses from
    one ring member per node (the last going forward, the first going back); the last
    accumulator goes straight home, S members back (burst.ring._Chain), so it leaves a node
    from every GPU whose owner lies on another node, and where both chains end together a GPU
    can send both its sums across. A review found that hop priced as one GPU's crossing (up to
    19.5% fast), a step where only one way sends priced as if both did, and USP with groups
    that straddle nodes priced at 0.68-0.75 of its time. One NIC a node here, so that every
    count of crossing GPUs shows (the a800's four give 1 to 4 senders a NIC each).

    kv, pay, acc: one hop's K/V, Q/dO/D/LSE and dQ bytes; bw(c): a GPU's bytes/s across nodes
    while c GPUs of its node cross."""
    from burst.masks import MaskSpec, ring_reach
    from burst.volume import ring_hop_bytes

    hw = HW.with_values(peak_tflops=1e12, hbm_gbps=1e12, nvlink_latency_us=0.0,
                        nic_latency_us=0.0, nics_per_node=1)
    method, opts, world, rpn, layout, causal, window, members, reach = CROSSING_CASES[case]
    seq, heads, d = 2**15 * 3 if world == 24 else 2**17, 8, 128
    u = opts.get("ulysses_degree", 1)
    m = seq // members
    assert ring_reach(MaskSpec(causal=causal, window=window), layout, members, m) == reach
    shape = AttnShape(batch=1, seq_len=seq, heads=heads, kv_heads=heads, head_dim=d,
                      causal=causal, window=window)
    topo = Topo(world, rpn)
    t = attention_timing(hw, method, dict(opts, layout=layout, backward="burst"), shape, topo)
    hop = dict(batch=1, seq_local=m, heads=heads // u, kv_heads=heads // u, head_dim=d,
               elem=2, acc_elem=4)
    kv = ring_hop_bytes("ring", **hop)[0]
    pay, acc = ring_hop_bytes("burst", **hop)

    def bw(senders):
        return hw.inter_gbps(senders) * 1e9

    if case == "one way, 8 back":
        # one GPU of a node crosses at each of the 8 steps, all 8 send their sums home
        forward = 8 * kv / bw(1)
        backward = 8 * (pay + acc) / bw(1) + acc / bw(8)
    elif case == "both ways, 2 each":
        # each step one GPU of the node crosses each way (the other way stays on the node);
        # steps: kv | kv (forward); pay | pay + acc one way, pay the other | acc | both sums
        # home, 2 hops each way, from both GPUs
        forward = 2 * kv / bw(2)
        backward = (pay + (pay + acc) + acc + 2 * acc) / bw(2)
    elif case == "2 one way, 1 the other":
        # GPUs 0-3 of a node; one way sends to i + 1 (GPU 3 crosses), the other to i - 1
        # (GPU 0) and ends first: step 1 sends one way only, step 2 GPU 3 sends the first
        # way's accumulator and the other's sum home (i + 1) across, step 3 the first way's
        # sums go home from GPUs 0 and 1 (i - 2)
        forward = kv / bw(2) + kv / bw(1)
        backward = pay / bw(2) + (pay + acc) / bw(1) + 2 * acc / bw(1) + acc / bw(2)
    elif case == "usp, U 4 on nodes of 8":
        # steps: pay both ways (2 members a ring cross, 8 GPUs); the accumulator one way only
        # (1 member a ring, 4 GPUs); both sums home, one hop each way (8 GPUs)
        forward = kv / bw(8)
        backward = pay / bw(8) + acc / bw(4) + acc / bw(8)
    else:
        # a hop of +-1 ring member is +-4 ranks: on node 0, GPUs 2-5 cross going up, 0-3 going
        # down, so both ways 6 GPUs cross and GPUs 2 and 3 send both blocks across; one way
        # alone (the accumulator, step 1) 4 GPUs
        forward = 2 * kv / bw(6)
        backward = 2 * pay / bw(6) + acc / bw(4) + 2 * acc / bw(6)
    if method == "usp":
        a2a = method_bytes("ulysses", world=u, batch=1, seq_local=seq // world, heads=heads,
                           kv_heads=heads, head_dim=d, elem=2)
        forward += collective_seconds(hw, a2a.sent("forward"), u, topo)
        backward += collective_seconds(hw, a2a.sent("backward"), u, topo)
    assert t.forward_s == pytest.approx(forward, rel=1e-9)
    assert t.backward_s == pytest.approx(backward, rel=1e-9)


def test_a_window_that_a_flat_ring_serves_runs_flat_on_nodes():
    """Burst on nodes of 8 (its double ring) with a causal window of at most a zigzag chunk:
    the code runs a flat ring of 1 + 1 hops (burst.masks.flat_ring_suffices), and the simulator
    prices that ring: its bytes are those of 2 hops, and it is faster than the unwindowed
    double ring, which sends every block."""
    from suites.schedule import plan_for

    base = dict(workload="attention", method="burst", seq_len=2**21, world=32,
                ranks_per_node=8, heads=32, kv_heads=8, head_dim=128, dtype="bfloat16",
                causal=True, options=dict(layout="zigzag", backward="burst", ranks_per_node=8))
    cell = as_cell(dict(base, window=(4096, 0)))
    topo = Topo(32, 8)
    shape = AttnShape(batch=1, seq_len=2**21, heads=32, kv_heads=8, head_dim=128, causal=True,
                      window=(4096, 0))
    assert plan_for("burst", cell.options, topo, shape).ring_local is None
    assert plan_for("burst", cell.options, topo,
                    dataclasses.replace(shape, window=None)).ring_local == 8
    windowed, plain = (simulate_cell(dict(base, window=w), HW) for w in ((4096, 0), None))
    assert windowed["status"] == plain["status"] == "ok"
    n = 2**21 // 32
    kv = 2 * n * 8 * 128 * 2  # one K+V block, bf16
    assert windowed["bytes_sent_forward"] == 2 * kv  # 1 + 1 hops
    assert plain["bytes_sent_forward"] == 31 * kv
    assert windowed["time_s"] < plain["time_s"] / 5


def test_the_flat_ring_a_double_ring_falls_back_to_is_never_slower(monkeypatch):
    """``burst.masks.flat_ring_suffices`` sends a windowed double ring's work to a flat ring
    only where that ring takes at most M - 1 steps each way (M nodes): priced on the a800 and
    h100 profiles, every such cell of a grid (nodes of 4 and 8) is at least as fast flat as on
    the double ring. One step more can be slower: 4 nodes of 4 with a zigzag window of 4 + 4
    hops keeps the double ring, and it is the faster one (14% on the a800, 9% on the h100).
    With L - 1 alone (the first rule, found by a review) 2 nodes of 8 with a 7-hop window ran
    flat: such a cell keeps the double ring, and it is the faster one (14% and 10%). (Priced
    with the double ring's blocks in the order burst.ring visits them; before a review found
    that order wrong, a windowed double ring was priced up to 1.9x fast, and these were 3%
    and 50-60%.)"""
    import suites.schedule as schedule
    from burst.masks import MaskSpec, flat_ring_suffices, ring_reach

    def seconds(cell, hw, flat):
        with monkeypatch.context() as m:
            m.setattr(schedule, "flat_ring_suffices", lambda *a, **k: flat)
            return predict(cell, hw).time_s

    def cell(world, rpn, seq, layout, win, backward):
        return dict(workload="attention", method="burst", seq_len=seq, world=world,
                    ranks_per_node=rpn, heads=32, kv_heads=8, head_dim=128, causal=True,
                    dtype="bfloat16", window=(win, 0),
                    options=dict(layout=layout, backward=backward, ranks_per_node=rpn))

    fell_back = 0
    for name in ("a800", "h100"):
        hw = load(name)
        for world, rpn, seq, layout, win, backward in itertools.product(
                (16, 32), (4, 8), (2**15, 2**21), ("contiguous", "zigzag"), (1024, 65536),
                ("burst", "ring")):
            if flat_ring_suffices(MaskSpec(causal=True, window=(win, 0)), layout, world,
                                  seq // world, world // rpn):
                fell_back += 1
                c = cell(world, rpn, seq, layout, win, backward)
                assert seconds(c, hw, True) <= seconds(c, hw, False), (name, c)
        seven = cell(16, 8, 2**15, "contiguous", 12289, "burst")
        assert not flat_ring_suffices(MaskSpec(causal=True, window=(12289, 0)), "contiguous",
                                      16, 2**11, 2)  # 7 hops <= L - 1, but > M - 1
        assert seconds(seven, hw, True) > 1.08 * seconds(seven, hw, False), name
        # one step more than M - 1: 4 + 4 hops on 4 nodes of 4
        four = cell(16, 4, 2**15, "zigzag", 4096, "burst")
        spec = MaskSpec(causal=True, window=(4096, 0))
        assert ring_reach(spec, "zigzag", 16, 2**11) == (4, 4)
        assert not flat_ring_suffices(spec, "zigzag", 16, 2**11, 4)
        assert seconds(four, hw, True) > 1.08 * seconds(four, hw, False), name
    assert fell_back >= 40


def test_a_dict_cell_naming_a_paper_system_is_the_specs_entry():
    """simulate_cell(dict(paper=...)) needed ``method`` and took checkpointing "none" and no
    fused head, where a spec's entry takes the system's (a planning audit); given keys win."""
    from suites.cells import expand
    from suites.simulate import as_cell, simulate_cell
    from suites.spec import load_spec

    spec = next(c for c in expand(load_spec("paper_main_7b"))
                if c.label == "Burst-Ring" and c.world == 32)
    row = simulate_cell(dict(workload="train_step", model="7b", paper="burstengine",
                             seq_len=spec.seq_len, world=32), HW)
    want = simulate_cell(spec, HW)
    assert (row["label"], row["method"], row["checkpointing"], row["fused_head"]) == (
        "Burst-Ring", "burst", "selective", True)
    assert row["tokens_per_s"] == want["tokens_per_s"]
    assert row["mem_reserved_bytes"] == want["mem_reserved_bytes"]
    full = as_cell(dict(workload="train_step", model="7b", paper="burstengine", world=32,
                        seq_len=spec.seq_len, checkpointing="full", fused_head=False))
    assert (full.label, full.checkpointing, full.fused_head) == (
        "Burst-Ring [checkpointing=full,fused_head=false]", "full", False)
    attn = as_cell(dict(paper="burst", seq_len=1 << 17, world=32, heads=32, head_dim=128,
                        checkpointing=None, fused_head=None), 8)  # None: not given
    assert (attn.method, attn.label, attn.options["ranks_per_node"]) == (
        "burst", "BurstAttention", 8)
    with pytest.raises(ValueError, match="unknown paper method 'bursty'"):
        as_cell(dict(paper="bursty", seq_len=64, world=1, heads=2, head_dim=8))
    # None is not given (a row read back from a table); options, under either name, are in
    # the label (the paper's label alone matches its published rows)
    kept = as_cell(dict(workload="train_step", model="7b", paper="burstengine", world=32,
                        seq_len=spec.seq_len, checkpointing=None, fused_head=None))
    assert (kept.label, kept.checkpointing, kept.fused_head) == ("Burst-Ring", "selective", True)
    for key in ("options", "method_options"):
        ring = as_cell(dict(paper="burst", seq_len=1 << 17, world=32, heads=32, head_dim=128,
                            **{key: {"backward": "ring"}}), 8)
        assert (ring.label, ring.options["backward"]) == ("BurstAttention [backward=ring]",
                                                          "ring"), key


def test_usp_backward_auto_prices_the_scheme_its_ring_picks():
    """usp takes backward="auto" (refused before, a planning audit): the simulator prices what
    burst_attn picks for its ring, burst for MHA and ring for few kv heads."""
    from suites.simulate import simulate_cell

    for kv, picked in ((32, "burst"), (4, "ring")):
        cell = dict(method="usp", seq_len=1 << 20, world=32, heads=32, kv_heads=kv,
                    head_dim=128, options=dict(ulysses_degree=8, backward="auto"))
        got = simulate_cell(cell, HW)
        want = simulate_cell({**cell, "options": dict(ulysses_degree=8, backward=picked)}, HW)
        other = simulate_cell({**cell, "options": dict(
            ulysses_degree=8, backward={"burst": "ring", "ring": "burst"}[picked])}, HW)
        assert got["status"] == "ok" and got["time_s"] == want["time_s"], kv
        assert got["bytes_sent_backward"] == want["bytes_sent_backward"] < other[
            "bytes_sent_backward"], kv


def test_the_summary_of_a_simulation_shows_its_reserved_memory():
    """A prediction has no saved_bytes (a training sweep's memory table was all '-'); its
    reserved peak, which decides OOM, is shown instead (a planning audit)."""
    from results import store
    from suites.run import summary_text

    root = Path(__file__).resolve().parent.parent / "results" / "simulated"
    for sweep in ("paper_main_7b", "paper_kernel_32gpu"):
        table = store.load(root / sweep)
        text = summary_text(table)
        assert "saved for backward" not in text and "\n\nreserved memory (MiB)\n" in text
        got = text.split("reserved memory (MiB)\n")[1].split("\n\n")[0]
        ok = table[table["status"] == "ok"]
        assert f"{ok['mem_reserved_bytes'].iloc[0] / 2**20:.1f}" in got, sweep
    assert "reserved memory" not in summary_text(table.assign(source="measured"))


def test_a_predicted_oom_names_its_largest_parts():
    """What to cut: a planning audit asked which part of an OOM's peak is the largest (Llama-3
    8B at 1M tokens on 16 H100s, selective: the plain head's logits)."""
    from suites.hardware import GIB, load
    from suites.simulate import predict, simulate_cell

    cell = dict(workload="train_step", model="llama3-8b", method="burst", seq_len=1 << 20,
                world=16, dtype="bfloat16", device="cuda", checkpointing="selective")
    row = simulate_cell(cell, "h100")
    parts = predict(cell, load("h100")).memory.parts
    top = sorted(parts, key=parts.get, reverse=True)
    assert row["status"] == "oom" and top[0] == "head", row
    named = row["error"].split("; allocated, largest first: ")[1]
    assert named.startswith(", ".join(f"{k} {parts[k] / GIB:.1f}" for k in top[:3]) + " GiB")
    assert named.endswith(f" and {len(top) - 3} smaller parts") == (len(top) > 4), named
    # a peak of four parts: the fourth counted, in the singular
    four = simulate_cell(dict(method="burst", seq_len=1 << 20, world=8, heads=32, head_dim=128,
                              dtype="bfloat16", device="cuda"),
                         load("a800").with_values(usable_gib=1))
    assert four["error"].endswith(", grads 4.0 GiB and 1 smaller part"), four["error"]


def test_an_oom_by_a_hair_prints_the_digits_that_tell_the_sides_apart():
    """A predicted OOM printed both sides to 2 decimals: "78.50 GiB reserved > 78.50 GiB
    usable" (a CLI fuzz, with --longest)."""
    from suites.simulate import simulate_cell

    cell = dict(method="burst", seq_len=1 << 20, world=8, heads=32, head_dim=128,
                dtype="bfloat16", device="cuda")
    ok = simulate_cell(cell, HW)
    assert ok["status"] == "ok"
    held = ok["mem_reserved_bytes"] / 2**30
    row = simulate_cell(cell, HW.with_values(usable_gib=held - 1e-4))
    assert row["status"] == "oom"
    got = re.fullmatch(r"predicted OOM: ([0-9.]+) GiB reserved > ([0-9.]+) GiB usable on a800"
                       r" \(usable_gib overridden\); allocated, largest first: .*", row["error"])
    assert got and float(got[1]) > float(got[2]) and len(got[1].split(".")[1]) == 4, row["error"]
    far = simulate_cell(cell, HW.with_values(usable_gib=held / 2))["error"]
    assert re.search(r": \d+\.\d\d GiB reserved > \d+\.\d\d GiB usable", far), far
    # a peak of exactly the usable memory fits (OOM is a peak above it, as the docs say)
    exact = predict(cell, HW).memory.reserved / 2**30
    assert predict(cell, HW.with_values(usable_gib=exact)).status == "ok"


def test_one_rank_under_fsdp_world_is_priced_as_the_trainer_runs_it():
    """At world 1 the Trainer shards nothing under data_parallel="fsdp_world" (no FSDP, no
    fp32 master copy of a bf16 model): the same prediction as without data parallelism (its
    optimizer was priced on a master copy: 0.076 s became 0.151 s for 7B at 32K)."""
    cell = dict(workload="train_step", model="7b", method="burst", seq_len=1 << 15, world=1,
                dtype="bfloat16", device="cuda", checkpointing="selective", fused_head=True)
    plain, world = predict(cell, HW), predict({**cell, "data_parallel": "fsdp_world"}, HW)
    assert (world.time_s, world.parts) == (plain.time_s, plain.parts)
    assert world.memory.reserved == plain.memory.reserved


def test_explain_says_where_a_cells_time_and_memory_go(tmp_path, capsys):
    """``explain``: a step's parts add up to its time (the collectives that overlap no compute
    are their own part: Megatron's distributed optimizer's and this engine's after the
    backward, fsdp_world's root unit's too; ZeRO-3's per-layer ones overlap the layers); an
    attention layer's kernels are at most its time; a cell that fits names its memory's largest
    parts (an OOM row's error does); an OOM row's times are said to be those were it to fit.
    ``simulate --explain`` prints it under each priced cell."""
    from suites.simulate import _largest, _time, explain
    from suites.simulate import main as simulate_main

    assert [_time(x) for x in (0.0371, 0.9996, 2.594, 99.96, 12345.6)] == [
        "37.1 ms", "1 s", "2.59 s", "100.0 s", "12345.6 s"]  # no 1e+03 ms, no 1.235e+04 s
    base = dict(workload="train_step", model="7b", seq_len=1 << 21, world=32)
    steps = {}
    for name, cell in (("zero3", dict(base, paper="burstengine")),
                       ("megatron", dict(base, paper="megatron_cp")),
                       ("engine", dict(base, method="burst", checkpointing="full")),
                       ("windows", dict(base, model="ministral-8b", seq_len=1 << 18,
                                        method="burst", data_parallel="fsdp_world",
                                        checkpointing="selective"))):
        p = predict(cell, HW)
        t = p.parts
        step = sum(t[k] for k in ("layers_forward", "layers_backward", "head", "optimizer",
                                  "per_step_collectives"))
        if p.status == "ok":
            assert step == pytest.approx(p.time_s, rel=1e-12), name
        steps[name] = (p, t["per_step_collectives"])
        text = explain(p)
        assert text.startswith(f"step {_time(step)}" + (" were it to fit:" if p.status == "oom"
                                                         else ":")), text
        assert f"; attention {_time(t['attention'])} of the layers'" in text
        assert text.endswith(_largest(p.memory)) == (p.status == "ok"), text
    assert steps["megatron"][0].status == "oom" and steps["megatron"][1] > 0
    assert steps["zero3"][1] == 0 and steps["engine"][1] > 0 and steps["windows"][1] > 0
    layer = predict(dict(paper="burst", seq_len=1 << 17, world=32, heads=32, head_dim=128), HW)
    a = layer.attn
    for kernels, whole in ((a.compute_forward_s, a.forward_s),
                           (a.compute_backward_s, a.backward_s)):  # a sum's last bit apart
        assert 0 < kernels <= whole * (1 + 1e-12)
    assert explain(layer).startswith(f"forward {_time(a.forward_s)} (kernels "
                                     f"{_time(a.compute_forward_s)}), backward ")
    assert "the rest waiting on transfers; allocated, largest first" in explain(layer)
    alone = explain(predict(dict(method="burst", seq_len=4096, world=1, heads=4, head_dim=64),
                            HW))  # one rank sends nothing: no waits to speak of
    assert "waiting" not in alone and "; allocated, largest first" in alone, alone
    huge = predict(dict(paper="burst", seq_len=1 << 25, world=8, heads=32, head_dim=128), HW)
    assert huge.status == "oom" and " were it to fit, the rest waiting" in explain(huge)
    assert "allocated" not in explain(huge)
    assert explain(predict(dict(method="tp", seq_len=64, world=2, heads=2, head_dim=8),
                           HW)) == ""
    # the CLI: one indented line under each priced cell (oom included), none under the others
    assert simulate_main(["paper_main_7b", "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()[:-1]  # the last: the run's summary
    pairs = [(lines[i], lines[i + 1] if i + 1 < len(lines) else "") for i in range(len(lines))
             if not lines[i].startswith(("    ", "note: "))]  # (the close calls' note)
    assert len(pairs) == 20
    for row_line, under in pairs:
        priced = " oom: " in row_line or "tokens/s per GPU" in row_line
        assert under.startswith("    step ") == priced, (row_line, under)
        if "tokens/s per GPU" in row_line:  # and the memory it reserves, tens of GiB here
            assert re.search(r"MFU [\d.]+%, \d\d\.\d GiB reserved$", row_line), row_line
    assert simulate_main(["paper_kernel_32gpu", "--longest", "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n    forward ") == out.count(" longest fit, ") > 0
