"""Every figure renders from a small fixture table (PNG, PDF and the plotted data as CSV), and
from empty tables (a note instead of a crash). Figures are pure functions of the tables."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from paper_figures.make import FIGURES, render_all
from paper_figures.tables import Tables, add_system
from results.paper import paper_rows
from suites.breakdowns import breakdown_rows


def _sim(rows: list[dict], **over) -> list[dict]:
    """Fixture 'simulated' copies of published rows (values x 0.9)."""
    out = []
    for r in rows:
        r = {**r, **over, "source": "simulated", "hardware": "a800"}
        for k in ("tokens_per_s", "attn_tflops", "mfu_model_flops_causal", "mem_reserved_bytes"):
            if r.get(k) is not None:
                r[k] *= 0.9
        if r["status"] == "missing":
            r["status"] = "oom"
        out.append(r)
    return out


@pytest.fixture(scope="module")
def fixture_tables() -> Tables:
    paper = paper_rows()
    kernel = [r for r in paper if r["workload"] == "attention"]
    main = [r for r in paper if r["workload"] == "train_step"]
    sim = _sim(kernel, sweep="paper_kernel_32gpu")
    sim += [dict(r, sweep=f"paper_main_{r['model']}") for r in _sim(main)]
    base = dict(workload="train_step", model="7b", source="simulated", hardware="a800",
                status="ok", checkpointing="selective", mem_reserved_bytes=40 * 2**30)
    for w in (1, 2, 4):  # weak scaling: two systems, one OOM
        for system, tps in (("burstengine", 1000 / w), ("megatron_cp", 900 / w)):
            sim.append(dict(base, sweep="paper_weak_scaling", world=w, seq_len=32768 * w,
                            label=system, method="burst", spec=json.dumps({"paper": system}),
                            tokens_per_s=tps, mfu_model_flops_causal=0.5,
                            status="oom" if (system, w) == ("megatron_cp", 4) else "ok"))
    for i, label in enumerate(("ring (flat, ring bwd)", "+ burst backward", "+ fused head")):
        sim.append(dict(base, sweep="paper_ablation", model="14b", world=32, seq_len=1 << 18,
                        label=label, method="burst", tokens_per_s=100.0 + 20 * i))
    cpu = []
    for src in ("measured", "simulated"):
        for w in (2, 4):
            for label, t in (("ring", 2.0), ("burst", 1.5)):
                cpu.append(dict(sweep="cpu_scaling", workload="attention", method=label,
                                label=label, world=w, seq_len=2048, status="ok", source=src,
                                device="cpu", time_s=t * w, bytes_sent_forward=1e6 * w,
                                bytes_sent_backward=2e6 * w, hardware="a800"))
    sim += [r for r in cpu if r["source"] == "simulated"]
    measured = [r for r in cpu if r["source"] == "measured"]
    return Tables(paper=add_system(pd.DataFrame(paper)), simulated=add_system(pd.DataFrame(sim)),
                  measured=add_system(pd.DataFrame(measured)),
                  breakdowns=pd.DataFrame(breakdown_rows(models=("7b", "14b"),
                                                         seq_lens=(1 << 14, 1 << 20))))


def test_every_figure_renders_from_fixture_tables(fixture_tables, tmp_path):
    done = render_all(fixture_tables, tmp_path)
    assert set(done) == {m.NAME for m in FIGURES}
    assert len(done) >= 9
    for name, paths in done.items():
        assert [p.suffix for p in paths] == [".png", ".pdf", ".csv"]
        assert all(p.stat().st_size > 0 for p in paths), name
        data = pd.read_csv(paths[2])
        assert len(data) > 0, f"{name} plotted nothing from the fixture"


def test_published_values_are_their_own_series(fixture_tables, tmp_path):
    done = render_all(fixture_tables, tmp_path, only=["main_throughput", "kernel_tflops"])
    for name in done:
        data = pd.read_csv(done[name][2])
        assert {"simulated", "paper"} <= set(data["source"]), name
    main = pd.read_csv(done["main_throughput"][2])
    burst = main[(main["label"] == "Burst-Ring") & (main["model"] == "14b")
                 & (main["world"] == 32) & (main["metric"] == "tokens_per_s")]
    assert set(burst["value"].round(2)) == {118.36, round(118.36 * 0.9, 2)}


def test_figures_render_without_tables(tmp_path):
    done = render_all(Tables(), tmp_path)
    assert all(p.exists() for paths in done.values() for p in paths)


def test_failed_cells_keep_their_status_in_the_plotted_data(fixture_tables, tmp_path):
    """A cell that did not run is a labelled gap with its status, never a zero value: an OOM
    ablation step, the simulated OOM peaks memory_bars still draws, weak-scaling OOM marks."""
    sim = fixture_tables.simulated.copy()
    first = sim.index[(sim["sweep"] == "paper_ablation")][0]
    sim.loc[first, "status"] = "oom"
    tables = Tables(paper=fixture_tables.paper, simulated=sim,
                    measured=fixture_tables.measured, breakdowns=fixture_tables.breakdowns)
    done = render_all(tables, tmp_path, only=["ablation", "memory_bars", "weak_scaling"])
    abl = pd.read_csv(done["ablation"][2])
    gap = abl[abl["status"] == "oom"]
    assert len(gap) == 2 and gap["value"].isna().all()  # tokens/s and memory
    mem = pd.read_csv(done["memory_bars"][2])
    assert "oom" in set(mem.loc[mem["source"] == "simulated", "status"])
    weak = pd.read_csv(done["weak_scaling"][2])
    assert "oom" in set(weak["status"])
