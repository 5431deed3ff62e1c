"""Every figure renders from a small fixture table (PNG, PDF and the plotted data as CSV), and
from empty tables (a note instead of a crash). Figures are pure functions of the tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from paper_figures.make import FIGURES, render_all
from paper_figures.tables import Tables, add_system
from results.paper import paper_rows
from suites.breakdowns import breakdown_rows

ROOT = Path(__file__).resolve().parent.parent


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
                                device="cpu", time_s=t * w, time_s_min=0.9 * t * w,
                                time_s_max=1.2 * t * w, bytes_sent_forward=1e6 * w,
                                bytes_sent_backward=2e6 * w, hardware="a800"))
        for w, status in ((2, "ok"), (4, "skipped")):  # a cell that cannot run stays a row
            cpu.append(dict(sweep="cpu_scaling", workload="attention", method="ulysses",
                            label="ulysses", world=w, seq_len=2048, status=status, source=src,
                            device="cpu", time_s=1.0 if status == "ok" else None,
                            bytes_sent_forward=5e5 if status == "ok" else None,
                            bytes_sent_backward=5e5 if status == "ok" else None,
                            hardware="a800"))
        for n in (1 << 18, 1 << 20):  # the long sweep: bytes and peak memory vs tokens
            for label, scale in (("ring", 1.0), ("burst", 0.75)):
                cpu.append(dict(sweep="cpu_long", workload="attention", method=label,
                                label=label, world=8, seq_len=n, status="ok", source=src,
                                device="cpu", time_s=n / 1e4, bytes_sent_forward=n,
                                bytes_sent_backward=3 * n * scale,
                                mem_peak_bytes=1500 * n * scale, hardware="a800"))
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
        # the plotted data's own columns, no index column (which changed every committed CSV
        # and no test: a mutation audit)
        plotted = _data({m.NAME: m for m in FIGURES}[name], fixture_tables)
        assert list(data.columns) == list(plotted.columns), name


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
    """Every figure, with no table at all: its PNG, PDF and CSV written, and a note in every
    panel instead of a bar (an empty dict of figures passed here before: a test audit)."""
    import matplotlib.pyplot as plt

    done = render_all(Tables(), tmp_path)
    assert list(done) == [mod.NAME for mod in FIGURES]
    for name, paths in done.items():
        assert [p.suffix for p in paths] == [".png", ".pdf", ".csv"], name
        assert all(p.exists() and p.stat().st_size > 0 for p in paths), name
    for mod in FIGURES:
        fig, data = mod.make(Tables())
        assert data.empty and fig.axes, mod.NAME
        for ax in fig.axes:
            notes = [t.get_text() for t in ax.texts]
            assert any(n.startswith(("no rows for this panel", "no measured CPU sweep"))
                       for n in notes), (mod.NAME, notes)
        plt.close(fig)


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


def _csv(done, name) -> pd.DataFrame:
    return pd.read_csv(done[name][2])


def _data(mod, tables: Tables) -> pd.DataFrame:
    """A figure's plotted data (its figure closed)."""
    import matplotlib.pyplot as plt

    fig, data = mod.make(tables)
    plt.close(fig)
    return data


def test_plotted_values_equal_their_sources_in_the_axis_units(fixture_tables, tmp_path):
    """One value per figure, recomputed from its source here: a unit, scale or formula slip in
    a figure (or in the breakdowns behind the analytic ones) changes it."""
    from burst import flops as F
    from burst.engine.configs import get_config

    done = render_all(fixture_tables, tmp_path)
    sim = fixture_tables.simulated
    main = _csv(done, "main_throughput")
    src = sim[(sim["label"] == "Burst-Ring") & (sim["model"] == "7b") & (sim["world"] == 32)]
    got = main[(main["label"] == "Burst-Ring") & (main["model"] == "7b") & (main["world"] == 32)
               & (main["source"] == "simulated")].set_index("metric")["value"]
    assert got["mfu_model_flops_causal"] == pytest.approx(100 * src["mfu_model_flops_causal"]
                                                          .iloc[0])
    mem = _csv(done, "memory_bars")
    m = mem[(mem["model"] == "14b") & (mem["world"] == 32) & (mem["label"] == "LoongTrain-Ring")]
    assert m.set_index("source")["value"]["paper"] == pytest.approx(71.2193)  # GiB, published
    assert m.set_index("source")["value"]["simulated"] == pytest.approx(0.9 * 71.2193)
    abl = _csv(done, "ablation").set_index(["step", "metric"])["value"]
    assert abl[("+ fused head", "tokens_per_s")] == pytest.approx(140.0)
    assert abl[("+ fused head", "mem_gib")] == pytest.approx(40.0)
    weak = _csv(done, "weak_scaling")
    w4 = weak[(weak["label"] == "burstengine") & (weak["world"] == 4)].set_index("metric")
    assert w4["value"]["tokens_per_s"] == pytest.approx(250.0)
    assert w4["value"]["mfu_model_flops_causal"] == pytest.approx(50.0)
    kern = _csv(done, "kernel_tflops")
    k = kern[(kern["label"] == "BurstAttention") & (kern["seq_len"] == 1 << 20)]
    assert k.set_index("source")["attn_tflops"]["simulated"] == pytest.approx(0.9 * 187.7,
                                                                              rel=1e-3)
    # the analytic figures against their formulas, written out here
    cfg, n, g = get_config("7b"), 1 << 20, 32
    share = _csv(done, "attention_share").set_index(["model", "series", "seq_len"])["value"]
    attn_fwd = cfg.num_layers * 4 * n * n * cfg.hidden_size / 2  # QK^T and PV, causal half
    assert share[("7b", "model_flops_causal", n)] == pytest.approx(
        attn_fwd / (F.model_flops(cfg, 1, n, "model_flops_causal") / 3))
    assert share[("7b", "model_flops_dense", n)] == pytest.approx(
        2 * attn_fwd / (F.model_flops(cfg, 1, n, "model_flops_dense") / 3))
    t, v, h = n // g, cfg.vocab_size, cfg.hidden_size
    logits = _csv(done, "logits_memory").set_index(["model", "series", "seq_len"])["GiB"]
    # fp32 logits and their gradient, the bf16 hidden input, the bf16 head weight and gradient
    assert logits[("7b", "plain head", n)] == pytest.approx((t * v * 8 + t * h * 2 + 2 * v * h * 2)
                                                            / 2**30)
    ckpt = _csv(done, "checkpoint_memory").set_index(["model", "series", "seq_len"])["GiB"]
    assert ckpt[("7b", "full", n)] == pytest.approx(cfg.num_layers * t * h * 2 / 2**30)
    cpu = _csv(done, "cpu_sweep")
    b = cpu[(cpu["metric"] == "bytes_sent") & (cpu["source"] == "measured")
            & (cpu["label"] == "burst") & (cpu["world"] == 4)]
    assert b["value"].tolist() == [12e6] and b["unit"].tolist() == ["bytes"]
    sp = cpu[(cpu["metric"] == "speedup_vs_ring") & (cpu["label"] == "burst")]
    assert sp["value"].tolist() == pytest.approx([2.0 / 1.5, 2.0 / 1.5])
    # the spread of the repeats: the slowest and fastest against the baseline's median
    assert sp["low"].tolist() == pytest.approx([2.0 / 1.8] * 2)
    assert sp["high"].tolist() == pytest.approx([2.0 / 1.35] * 2)


def _with(fixture_tables, simulated=None, measured=None) -> Tables:
    return Tables(paper=fixture_tables.paper,
                  simulated=fixture_tables.simulated if simulated is None else simulated,
                  measured=fixture_tables.measured if measured is None else measured,
                  breakdowns=fixture_tables.breakdowns)


def test_panels_hold_one_cell_per_bar_on_the_figures_hardware(fixture_tables, tmp_path):
    """A sweep with another length, rows simulated on another profile, and rows measured on
    another GPU do not land in (or replace) the A800 panel's bars."""
    sim = fixture_tables.simulated
    main7 = sim[(sim["sweep"] == "paper_main_7b") & (sim["world"] == 32)]
    longer = main7.assign(seq_len=1 << 22, tokens_per_s=1.0)
    h100 = main7.assign(hardware="h100", tokens_per_s=2.0)
    h200 = main7.assign(source="measured", device="cuda", hardware="NVIDIA H200",
                        tokens_per_s=3.0)
    a800 = main7.assign(source="measured", device="cuda", hardware="NVIDIA A800-SXM4-80GB",
                        tokens_per_s=4.0)
    tables = _with(fixture_tables, simulated=pd.concat([sim, longer, h100]),
                   measured=pd.concat([fixture_tables.measured, h200, a800]))
    main = _csv(render_all(tables, tmp_path, only=["main_throughput"]), "main_throughput")
    burst = main[(main["label"] == "Burst-Ring") & (main["model"] == "7b")
                 & (main["world"] == 32) & (main["metric"] == "tokens_per_s")]
    values = burst.set_index("source")["value"]
    assert values["simulated"] == pytest.approx(main7.set_index("label")["tokens_per_s"]
                                                ["Burst-Ring"])
    assert values["measured"] == 4.0 and len(burst) == 3


def test_a_cell_without_a_number_is_never_drawn_as_zero_or_dropped(fixture_tables, tmp_path):
    sim = fixture_tables.simulated.copy()
    main = sim.index[(sim["label"] == "Burst-USP") & (sim["model"] == "7b")
                     & (sim["world"] == 32)][0]
    sim.loc[main, "tokens_per_s"] = float("nan")  # ok, but no number
    kern = sim.index[(sim["sweep"] == "paper_kernel_32gpu") & (sim["label"] == "BurstAttention")
                     & (sim["seq_len"] == 1 << 18)][0]
    sim.loc[kern, "status"] = "error"
    measured = fixture_tables.measured.copy()
    measured.loc[(measured["label"] == "ring") & (measured["world"] == 4),
                 "bytes_sent_backward"] = float("nan")
    timeout = sim.loc[[main]].assign(source="measured", device="cuda", status="timeout",
                                     hardware="NVIDIA A800-SXM4-80GB")
    tables = _with(fixture_tables, simulated=sim, measured=pd.concat([measured, timeout]))
    done = render_all(tables, tmp_path, only=["main_throughput", "kernel_tflops", "cpu_sweep"])
    m = _csv(done, "main_throughput")
    m = m[(m["label"] == "Burst-USP") & (m["model"] == "7b") & (m["world"] == 32)
          & (m["metric"] == "tokens_per_s")].set_index("source")
    assert m.loc["simulated", "status"] == "no value" and pd.isna(m.loc["simulated", "value"])
    assert m.loc["measured", "status"] == "timeout"
    k = _csv(done, "kernel_tflops")
    assert k[(k["label"] == "BurstAttention") & (k["seq_len"] == 1 << 18)
             & (k["source"] == "simulated")]["status"].tolist() == ["error"]
    c = _csv(done, "cpu_sweep")
    ring4 = c[(c["label"] == "ring") & (c["world"] == 4) & (c["source"] == "measured")
              & (c["metric"] == "bytes_sent")]
    assert ring4["value"].isna().all() and len(ring4) == 1


def test_two_labels_of_one_system_are_two_lines(fixture_tables):
    from paper_figures import weak_scaling

    sim = fixture_tables.simulated
    weak = sim[(sim["sweep"] == "paper_weak_scaling") & (sim["label"] == "burstengine")]
    full = weak.assign(label="burstengine w/o sele-ckpt", checkpointing="full",
                       tokens_per_s=weak["tokens_per_s"] / 2)
    fig, _ = weak_scaling.make(_with(fixture_tables, simulated=pd.concat([sim, full])))
    lines = {ln.get_label(): ln for ln in fig.axes[0].lines}
    assert list(lines["burstengine"].get_ydata()) == pytest.approx([1000, 500, 250])
    assert list(lines["burstengine w/o sele-ckpt"].get_ydata()) == pytest.approx([500, 250, 125])
    assert lines["burstengine w/o sele-ckpt"].get_linestyle() == "--"


def test_the_later_of_two_rows_of_one_point_is_drawn(fixture_tables):
    """Lines keep each point's last row, as bars do; they sorted by world or length first,
    and pandas' default sort is not stable past 16 rows, so an older row could be drawn."""
    import dataclasses

    import matplotlib.pyplot as plt

    from paper_figures import kernel_tflops, weak_scaling

    sim = fixture_tables.simulated
    for fig_, sweep, x, metric in ((weak_scaling, "paper_weak_scaling", "world", "tokens_per_s"),
                                   (kernel_tflops, "paper_kernel_32gpu", "seq_len",
                                    "attn_tflops")):
        new = sim[(sim["sweep"] == sweep) & (sim["status"] == "ok")]
        new = new[new["label"] == new["label"].iloc[0]].sort_values(x)
        old = pd.concat([new.assign(**{metric: new[metric] * 3})] * 8)  # 8 older runs
        fig, data = fig_.make(dataclasses.replace(fixture_tables, simulated=pd.concat(
            [sim, old, new], ignore_index=True)))
        plt.close(fig)
        data = data[(data["source"] == "simulated") & (data["label"] == new["label"].iloc[0])
                    & data[x].isin(new[x])]
        got = data.loc[data["metric"] == metric, "value"] if "metric" in data else data[metric]
        assert got.tolist() == pytest.approx(new[metric].tolist()), fig_.NAME


def test_the_cpu_sweep_draws_the_later_of_two_measured_rows_of_one_cell(fixture_tables):
    """Tables holding a measured cell twice (two runs passed together): the CPU figure drew
    both rows and its speedup's lookup by world crashed on the repeated baseline."""
    import dataclasses

    import matplotlib.pyplot as plt

    from paper_figures import cpu_sweep

    mea = fixture_tables.measured
    cpu = mea["sweep"].isin(["cpu_scaling", "cpu_long"])
    new = mea[cpu]
    old = new.assign(time_s=new["time_s"] * 3, bytes_sent_forward=new["bytes_sent_forward"] * 3,
                     mem_peak_bytes=new["mem_peak_bytes"] * 3)
    fig, data = cpu_sweep.make(dataclasses.replace(
        fixture_tables, measured=pd.concat([mea[~cpu], old, new], ignore_index=True)))
    plt.close(fig)
    fig, once = cpu_sweep.make(fixture_tables)
    plt.close(fig)
    assert len(data) == len(once)
    pd.testing.assert_frame_equal(data.reset_index(drop=True), once.reset_index(drop=True))


def test_loading_keeps_each_profiles_latest_run_and_refuses_a_missing_folder(tmp_path, capsys):
    from paper_figures.make import main
    from paper_figures.tables import load_tables
    from suites.simulate import simulate_spec

    spec = tmp_path / "tiny.toml"
    spec.write_text('description = "t"\nworkload = "attention"\ndevice = "cuda"\n'
                    'dtype = "bfloat16"\nseq_lens = [65536]\nworld = 8\n'
                    '[shape]\nheads = 8\nhead_dim = 128\n[[methods]]\nname = "burst"\n')
    for hw in ("a800", "h100"):
        simulate_spec(spec, hw, out_dir=tmp_path / "results" / "simulated")
    # measured runs name their GPU per row, not in run.json: an older A800 run of a sweep
    # stays next to a newer run on another GPU
    from results import store

    row = simulate_spec(spec, "a800")[0]
    for i, gpu in enumerate(("NVIDIA A800-SXM4-80GB", "NVIDIA H100 80GB HBM3")):
        run = tmp_path / "results" / "tiny" / f"run{i}"
        run.mkdir(parents=True)
        store.write_meta(run, {"created": f"2026-01-0{i + 1}T00:00:00Z"})
        store.append_row(run / store.ROWS, dict(row, source="measured", hardware=gpu))
    tables = load_tables(tmp_path / "results")
    assert sorted(tables.simulated["hardware"]) == ["a800", "h100"]
    assert sorted(tables.measured["hardware"]) == ["NVIDIA A800-SXM4-80GB",
                                                   "NVIDIA H100 80GB HBM3"]
    # two runs on one GPU: the newer one is drawn (the older was: a mutation audit)
    for i, tflops in ((2, 111.0), (3, 222.0)):
        run = tmp_path / "results" / "tiny" / f"run{i}"
        run.mkdir(parents=True)
        store.write_meta(run, {"created": f"2026-01-0{i + 1}T00:00:00Z"})
        for _ in range(2 if i == 2 else 1):  # the older run's one cell, retried: 2 rows
            store.append_row(run / store.ROWS, dict(row, source="measured", attn_tflops=tflops,
                                                    hardware="NVIDIA A800-SXM4-80GB"))
    loaded = load_tables(tmp_path / "results")
    newest = loaded.measured
    assert list(newest[newest["hardware"] == "NVIDIA A800-SXM4-80GB"]["attn_tflops"]) == [222.0]
    # runs are compared by their cells, not their rows: a retry does not make a run "fuller"
    assert not any("not shown" in n for n in loaded.notes), loaded.notes
    other = dict(row, cell_id="another-cell", source="measured", attn_tflops=1.0,
                 hardware="NVIDIA A800-SXM4-80GB")
    store.append_row(tmp_path / "results" / "tiny" / "run2" / store.ROWS, other)
    assert any("run3 (1 cell); older runs with more cells are not shown: run2 (2 cells)" in n
               for n in load_tables(tmp_path / "results").notes)
    # a missing folder, and one without any table (every figure would be empty), are refused
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("")
    for folder, why in (("no_such_folder", "no such folder"), ("empty", "holds no result table"),
                        ("a_file", "a file, not a folder")):
        with pytest.raises(SystemExit) as e:
            main(["--results", str(tmp_path / folder), "--out", str(tmp_path / "o")])
        assert e.value.code == 2 and not (tmp_path / "o").exists()
        assert why in capsys.readouterr().err
    (tmp_path / "o").write_text("")
    for argv, why in ((["--out", str(tmp_path / "o")], "is a file, not a folder"),
                      (["--out", str(tmp_path / "o2"), "--only"], "--only needs figure names")):
        with pytest.raises(SystemExit) as e:  # --only with no name: not "all" by accident
            main(["--results", str(tmp_path / "results"), *argv])
        assert e.value.code == 2 and why in capsys.readouterr().err


def test_measured_runs_are_grouped_by_the_hardware_their_rows_name(tmp_path):
    """A measured run's first row is often a cell skipped before it ran (skip_invalid), with no
    hardware: the run's GPU is the first one a row names, so a newer H100 run does not hide
    the A800 one, and the skipped cell is drawn as the A800 run's. A run that cannot be read is
    named in the notes (it vanished without a word)."""
    from paper_figures import main_throughput
    from paper_figures.tables import load_tables
    from results import store

    sim = store.read_rows(ROOT / "results/simulated/paper_main_14b/simulated-a800/rows.jsonl")
    rows = ([r for r in sim if r["status"] == "skipped"]  # as the harness writes them: first
            + [r for r in sim if r["status"] != "skipped"])
    for i, gpu in enumerate(("NVIDIA A800-SXM4-80GB", "NVIDIA H100 80GB HBM3")):
        run = tmp_path / "results" / "paper_main_14b" / f"run{i}"
        run.mkdir(parents=True)
        store.write_meta(run, {"created": f"2026-01-0{i + 1}T00:00:00Z"})
        for r in rows:
            store.append_row(run / store.ROWS, dict(r, source="measured", device="cuda",
                             hardware=None if r["status"] == "skipped" else gpu))
    tables = load_tables(tmp_path / "results")
    drawn = main_throughput.drawn_rows(tables)
    mea = drawn[drawn["source"] == "measured"]
    skipped = sum(r["status"] == "skipped" for r in rows)
    assert len(mea) == len(rows) and (mea["status"] == "skipped").sum() == skipped > 0
    assert set(mea["hardware"]) == {"NVIDIA A800-SXM4-80GB"}
    assert tables.notes == []
    bad = tmp_path / "results" / "paper_main_14b" / "run0" / store.ROWS
    lines = bad.read_text().splitlines(keepends=True)
    bad.write_text("".join(lines[:3] + ["not json\n"] + lines[3:]))
    tables = load_tables(tmp_path / "results")
    assert not (main_throughput.drawn_rows(tables)["source"] == "measured").any()
    assert any("run0: not drawn, its rows cannot be read" in n and "line 4" in n
               for n in tables.notes), tables.notes


def test_cpu_figure_draws_one_machine_and_the_specs_baseline(tmp_path):
    """Two measured runs of cpu_scaling on different machines crashed every figure (a speedup
    indexed by world with each world twice); the newest machine's rows are drawn. The speedup
    is over the spec's baseline, not ring by name."""
    import shutil

    from paper_figures import cpu_sweep
    from paper_figures.tables import load_tables
    from results import store

    src = store.latest_run(ROOT / "results/cpu_scaling", with_rows=True)
    rows = store.read_rows(src / store.ROWS)
    shutil.copytree(src, tmp_path / "results/cpu_scaling/a")
    b = tmp_path / "results/cpu_scaling/b"
    b.mkdir()
    meta = store.read_meta(src)
    store.write_meta(b, dict(meta, created="2099-01-01T00:00:00Z"))
    for r in rows:
        spec = json.loads(r["sweep_spec"])
        store.append_row(b / store.ROWS, dict(
            r, hardware="another CPU" if r.get("hardware") else None, date="2099-01-01",
            sweep_spec=json.dumps(dict(spec, baseline="burst"))))
    tables = load_tables(tmp_path / "results")
    host = next(r["hardware"] for r in rows if r.get("hardware"))
    assert set(tables.measured["hardware"]) == {host, "another CPU"}
    _, data = cpu_sweep.make(tables)
    mea = data[(data["source"] == "measured") & (data["sweep"] == "cpu_scaling")]
    assert len(mea) and set(mea["metric"]) == {"bytes_sent", "speedup_vs_burst"}
    burst = mea[(mea["label"] == "burst") & (mea["status"] == "ok")
                & (mea["metric"] == "speedup_vs_burst")]
    assert burst["value"].tolist() == pytest.approx([1.0] * len(burst))


def test_published_kernel_rows_compare_with_the_simulated_cells():
    """The published attention rows are one layer with nothing recomputed and no LM head, as
    the harness's and the simulator's: compare matched none of them (checkpointing and
    fused_head were empty)."""
    from results import paper, store
    from results.tables import compare

    published = pd.DataFrame(paper.kernel_rows())
    sim = store.load(ROOT / "results/simulated/paper_kernel_32gpu/simulated-a800")
    c = compare(published, sim, "attn_tflops", names=("paper", "sim"))
    assert len(c) == 16 and (c["status_sim"] == "ok").all()


def test_cpu_figure_keeps_cells_without_a_number_and_draws_the_long_sweep(fixture_tables,
                                                                          tmp_path):
    done = render_all(fixture_tables, tmp_path, only=["cpu_sweep"])
    cpu = _csv(done, "cpu_sweep")
    uly = cpu[(cpu["label"] == "ulysses") & (cpu["world"] == 4) & (cpu["source"] == "measured")]
    assert set(uly["metric"]) == {"bytes_sent", "speedup_vs_ring"}
    assert (uly["status"] == "skipped").all() and uly["value"].isna().all()
    long = cpu[cpu["sweep"] == "cpu_long"].set_index(["source", "label", "metric", "seq_len"])
    n = 1 << 20
    assert long.loc[("measured", "burst", "bytes_sent", n), "value"] == n + 2.25 * n
    assert long.loc[("simulated", "ring", "bytes_sent", n), "value"] == 4 * n
    assert long.loc[("measured", "burst", "mem_peak", n), "value"] == 1125 * n
    from paper_figures import cpu_sweep

    fig, _ = cpu_sweep.make(fixture_tables)
    # both top panels draw the sweep's longest length alone, and both say which (an audit
    # found the speedup panel silent on it)
    n = int(fixture_tables.measured.query("sweep == 'cpu_scaling'")["seq_len"].max())
    assert all(f"at {n} tokens" in ax.get_title() for ax in fig.axes[:2])
    for ax in fig.axes[:2]:  # the skipped cell is marked at the floor of both top panels,
        marks = [c for c in ax.collections
                 if len(c.get_offsets()) and c.get_transform() != ax.transData]
        assert marks, ax.get_title()
        # with its status in words beside it: a bare mark on an axis that does not start at
        # 0 read as a value (an audit read a skipped Ulysses as "0.57x over ring")
        words = [t.xy for t in ax.texts if t.get_text() == "cannot run"]
        assert words == [(4, 0.03)], ax.get_title()
        assert any(tuple(c.get_offsets()[0]) == (4, 0.03) for c in marks), ax.get_title()


def test_memory_bars_tag_the_peaks_predicted_oom(fixture_tables):
    from paper_figures import memory_bars

    sim = fixture_tables.simulated.copy()
    pick = ((sim["sweep"] == "paper_main_7b") & (sim["world"] == 64)
            & (sim["label"] == "Burst-Ring"))
    sim.loc[pick, ["status", "mem_reserved_bytes"]] = ["oom", 90 * 2**30]
    fig, d = memory_bars.make(_with(fixture_tables, simulated=sim))
    row = d[(d["model"] == "7b") & (d["world"] == 64) & (d["label"] == "Burst-Ring")
            & (d["source"] == "simulated")]
    assert row["status"].tolist() == ["oom"] and row["value"].tolist() == [90.0]
    ax = fig.axes[1]  # 7B on 64 GPUs
    labels = [t.get_text() for t in ax.get_xticklabels()]
    i = labels.index("Burst-Ring")
    tags = [t.get_text() for t in ax.texts if abs(t.get_position()[0] - i) < 1e-9]
    assert any("sim OOM" in t for t in tags), tags


def test_figures_say_when_the_simulation_is_on_another_profile(tmp_path):
    """Simulated on h100 only, every paper figure drew empty without a word."""
    from paper_figures.tables import load_tables
    from suites.simulate import simulate_spec

    simulate_spec("paper_kernel_32gpu", "h100", tmp_path / "simulated")
    (note,) = load_tables(tmp_path).notes
    assert "draw the a800 simulation" in note and "holds only h100" in note


def test_a_simulated_number_where_the_paper_ran_out_of_memory_is_drawn_apart(fixture_tables):
    """Megatron-CP's simulated line at 512K-1M read as agreeing with the paper, which reports
    OOM there (the x marks at the floor were easy to miss). Its point is ringed in its own
    colour over every other mark, open: a black ring under the other marks lay around the other
    methods' diamonds at the same height, and an audit read it as theirs; a filled dot on top
    hid those diamonds (a review)."""
    import dataclasses

    from matplotlib.colors import to_rgba

    from paper_figures import kernel_tflops
    from paper_figures.palette import series_color

    sim = fixture_tables.simulated.copy()
    at = (sim["sweep"] == "paper_kernel_32gpu") & (sim["system"] == "megatron_cp") & (
        sim["seq_len"] == 1 << 19)
    assert at.sum() == 1
    sim.loc[at, ["status", "attn_tflops"]] = ["ok", 170.0]
    fig, data = kernel_tflops.make(dataclasses.replace(fixture_tables, simulated=sim))
    flagged = data[data["oom_in_paper"]]
    assert list(zip(flagged["system"], flagged["seq_len"], strict=True)) == [
        ("megatron_cp", 1 << 19)]
    ax = fig.axes[0]
    dots = [c for c in ax.collections if len(c.get_offsets())
            and tuple(c.get_offsets()[0]) == (1 << 19, 170.0)]
    assert len(dots) == 1
    assert len(dots[0].get_facecolor()) == 0 or dots[0].get_facecolor()[0][3] == 0  # open
    assert tuple(dots[0].get_edgecolor()[0]) == to_rgba(series_color("megatron_cp"))
    assert dots[0].get_zorder() > max(a.get_zorder() for a in [*ax.collections, *ax.lines]
                                      if a is not dots[0])


# ---- the committed tables (results/), drawn once: published values, colours, hatching,
# ablation order, labels, and whether paper_figures/out/ is current

@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """(tables, {name: (figure, plotted data)}) of the committed results/ tables: the files git
    tracks under results/, copied (a run of one's own, e.g. `burst-bench run cpu_scaling`, is
    not what the committed figures drew); results/ itself outside a git checkout."""
    import shutil
    import subprocess
    from pathlib import Path

    import matplotlib.pyplot as plt

    from paper_figures.tables import load_tables

    root = Path(__file__).resolve().parent.parent
    try:
        tracked = subprocess.run(["git", "ls-files", "-z", "results"], cwd=root, check=True,
                                 capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        tracked = []
    results = root / "results"
    if any(tracked):
        results = tmp_path_factory.mktemp("committed") / "results"
        for name in filter(None, tracked):
            dest = results.parent / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, dest)
    tables = load_tables(results)
    drawn = {mod.NAME: mod.make(tables) for mod in FIGURES}
    yield tables, drawn
    for fig, _ in drawn.values():
        plt.close(fig)


def _reference(name: str) -> list[dict]:
    """A published table as the reference CSV has it (read here, not through results.paper)."""
    import csv

    from results.paper import PAPER_DIR

    with open(PAPER_DIR / name, newline="") as f:
        return list(csv.DictReader(f))


def _num(s: str) -> float | None:
    return float(s) if s else None


def test_every_published_value_drawn_is_the_reference_tables(committed):
    """Every published row a figure plots carries the reference CSV's number and status, and
    every reference row of a drawn panel is plotted (tokens/s, memory, kernel TFLOP/s)."""
    _, drawn = committed
    main_ref = _reference("burstengine_main.csv")
    for name, metric, column in (("main_throughput", "tokens_per_s", "tokens_per_s_per_gpu"),
                                 ("memory_bars", "mem_reserved_gib", "memory_gb")):
        data = drawn[name][1]
        got = data[(data["source"] == "paper") & (data["metric"] == metric)]
        got = {(r["model"], int(r["world"]), r["label"]): (r["value"], r["status"])
               for r in got.to_dict("records")}
        panels = {(m, w) for m, w, _ in got}
        want = {(r["model"], int(r["gpus"]), r["label"]): (_num(r[column]), r["status"])
                for r in main_ref if (r["model"], int(r["gpus"])) in panels}
        assert len(panels) == 4 and got.keys() == want.keys(), name
        for key, (value, status) in want.items():
            # an ok row without this number (memory not recorded) is 'no value', not 0
            assert got[key][1] == ("no value" if status == "ok" and value is None
                                   else status), (name, key)
            if value is None:
                assert pd.isna(got[key][0]), (name, key)
            else:
                assert got[key][0] == pytest.approx(value, rel=1e-12), (name, key)
    kern = drawn["kernel_tflops"][1]
    kern = kern[kern["source"] == "paper"]
    got = {(r["label"], int(r["seq_len"])): (r["attn_tflops"], r["status"])
           for r in kern.to_dict("records")}
    want = {(r["label"], int(r["seq_len"])): (_num(r["tflops_per_gpu"]), r["status"])
            for r in _reference("burstattention_kernel_32gpu.csv")}
    assert got.keys() == want.keys()
    for key, (value, status) in want.items():
        assert got[key][1] == status, key
        assert (pd.isna(got[key][0]) if value is None
                else got[key][0] == pytest.approx(value, rel=1e-12)), key


def test_published_and_simulated_mfu_share_one_convention(committed):
    """Within a panel (one model, length, GPU count) MFU per token/s is the same for every bar
    and marker: published MFU is its tokens/s under the simulated rows' FLOP convention."""
    data = committed[1]["main_throughput"][1]
    wide = data.pivot_table(index=["model", "world", "label", "source"], columns="metric",
                            values="value")
    ratio = (wide["mfu_model_flops_causal"] / wide["tokens_per_s"]).dropna()
    for panel, r in ratio.groupby(level=["model", "world"]):
        assert {"paper", "simulated"} <= set(r.index.get_level_values("source")), panel
        assert r.max() == pytest.approx(r.min(), rel=1e-9), panel


def test_simulated_and_published_rows_of_a_label_agree_on_checkpointing(committed):
    """Real simulated rows (not copies of published ones): each label of the main, memory and
    weak-scaling figures has one checkpointing mode across sources, full exactly for the
    'w/o sele-ckpt' labels, and every published bar label has a simulated bar."""
    from paper_figures._bars import rows_for
    from paper_figures.main_throughput import SWEEPS

    tables, _ = committed
    df = rows_for(tables, "train_step")
    main = df[df["sweep"].isin(SWEEPS) | (df["source"] == "paper")]
    weak = df[df["sweep"] == "paper_weak_scaling"]
    for d in (main, weak):
        assert len(d)
        for label, g in d.groupby("label"):
            assert g["checkpointing"].nunique() == 1, (label, set(g["checkpointing"]))
            assert (g["checkpointing"].iloc[0] == "full") == ("w/o sele-ckpt" in label), label
    for (model, world, seq), g in main.groupby(["model", "world", "seq_len"]):
        if (g["source"] == "paper").any():
            missing = set(g.loc[g["source"] == "paper", "label"]) - set(
                g.loc[g["source"] == "simulated", "label"])
            assert not missing, (model, world, seq, missing)


def _bars_of(fig):
    """(label, facecolour hex, hatch) of every bar, per axis with bars."""
    from matplotlib.colors import to_hex

    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        if ax.patches and labels:
            assert len(ax.patches) == len(labels)
            yield [(lab, to_hex(p.get_facecolor()), p.get_hatch() or "")
                   for lab, p in zip(labels, ax.patches, strict=True)]


def _lines_of(fig, labels):
    from matplotlib.colors import to_hex

    return [(ln.get_label(), to_hex(ln.get_color()), ln.get_linestyle())
            for ax in fig.axes for ln in ax.get_lines() if ln.get_label() in labels]


def test_a_system_has_its_one_palette_colour_in_every_figure(committed):
    """Bars and lines take their system's colour (palette.COLORS, never a label's fallback
    grey), the same one in every figure; the CPU figure's variants their variant shade."""
    from paper_figures import palette

    _, drawn = committed
    seen: dict[str, set[str]] = {}
    for name in ("main_throughput", "memory_bars", "weak_scaling", "kernel_tflops"):
        fig, data = drawn[name]
        system = dict(zip(data["label"], data["system"], strict=True))
        drawn_series = [s for panel in _bars_of(fig) for s in panel]
        drawn_series += _lines_of(fig, system)
        assert len(drawn_series) >= 4, name
        for label, colour, _ in drawn_series:
            assert colour == palette.COLORS[system[label]], (name, label, colour)
            seen.setdefault(system[label], set()).add(colour)
    assert len(seen) >= 5 and all(len(c) == 1 for c in seen.values()), seen
    fig, data = drawn["cpu_sweep"]
    system = dict(zip(data["label"], data["system"], strict=True))
    lines = _lines_of(fig, system)
    assert {lab for lab, _, _ in lines} == set(system)
    for label, colour, _ in lines:
        assert colour == palette.series_color(system[label], label), label
        assert colour == palette.color(label)  # burst[bwd=ring]: burst's lighter shade
    assert palette.series_color("burstengine", "Burst-Ring w/o sele-ckpt") == \
        palette.COLORS["burstengine"]


def test_hatching_marks_exactly_the_full_recomputation_bars(committed):
    from paper_figures import palette

    assert palette.hatch("full") == "//" and not palette.hatch("selective")
    assert palette.linestyle("full") == "--" and palette.linestyle("selective") == "-"
    _, drawn = committed
    for name in ("main_throughput", "memory_bars", "ablation"):
        fig, data = drawn[name]
        # (the ablation's upper panels share the lower ones' ticks: their labels are empty)
        bars = [s for panel in _bars_of(fig) for s in panel if s[0]]
        hatched = {lab for lab, _, h in bars if h}
        plain = {lab for lab, _, h in bars if not h}
        assert hatched and plain, name
        if name == "ablation":  # its steps are named by the option they add (ticks)
            full = set(data.loc[data["checkpointing"] == "full", "step"])
            assert hatched == full and not plain & full, (hatched, plain)
        else:
            assert all("w/o sele-ckpt" in lab for lab in hatched), (name, hatched)
            assert not any("w/o sele-ckpt" in lab for lab in plain), (name, plain)
        legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
        assert "hatched: w/o sele-ckpt (full recomputation)" in legend, name


def test_ablation_keeps_the_specs_step_order_and_speeds_up_over_the_first_step(committed):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from suites.spec import SPEC_DIR

    with open(SPEC_DIR / "paper_ablation.toml", "rb") as f:
        spec_steps = [m["label"] for m in tomllib.load(f)["methods"]]
    fig, data = committed[1]["ablation"]
    for (n, metric), d in data.groupby(["seq_len", "metric"], sort=False):
        assert d["label"].tolist() == spec_steps, (n, metric)
        if metric == "tokens_per_s":
            v = d["value"].tolist()
            assert d["speedup"].tolist() == pytest.approx([x / v[0] for x in v])
            assert d["speedup"].iloc[0] == 1.0
            assert set(d["speedup_over"]) == {spec_steps[0]}
    top = [ax for ax in fig.axes if ax.get_title()]
    assert len(top) == 2
    for ax, (_, d) in zip(top, data[data["metric"] == "tokens_per_s"].groupby(
            "seq_len", sort=False), strict=True):
        texts = sorted((t.get_position()[0], t.get_text()) for t in ax.texts)
        assert [s for _, s in texts] == [f"{x:.2f}x" for x in d["speedup"]]
    ticks = [t.get_text() for t in fig.axes[-1].get_xticklabels()]
    # each step changes one thing, the layout its own step (the half cache needs it)
    assert ticks == spec_steps and ticks[5:] == ["+ striped layout",
                                                 "+ selective ckpt (half cache)"]
    assert data.drop_duplicates("label")["step"].tolist() == ticks  # the CSV names what is drawn


def test_ablation_step_labels_name_a_layout_change():
    from paper_figures.ablation import speedups, step_labels

    zig, striped = '{"layout": "zigzag"}', '{"layout": "striped"}'
    assert step_labels(["a", "b", "c"], [zig, zig, striped]) == ["a", "b",
                                                                "c + striped layout"]
    assert step_labels(["a", "b striped"], [zig, striped]) == ["a", "b striped"]
    assert step_labels(["a", "b"], [None, float("nan")]) == ["a", "b"]
    assert speedups([float("nan"), 2.0, 3.0])[1:] == [1.0, 1.5]


def test_ablation_speedups_are_over_the_first_step_that_ran(fixture_tables):
    from paper_figures import ablation

    sim = fixture_tables.simulated.copy()
    first = sim.index[(sim["sweep"] == "paper_ablation")][0]
    sim.loc[first, "status"] = "oom"
    fig, data = ablation.make(_with(fixture_tables, simulated=sim))
    tps = data[data["metric"] == "tokens_per_s"]
    assert tps["step"].tolist() == ["ring (flat, ring bwd)", "+ burst backward", "+ fused head"]
    assert pd.isna(tps["speedup"].iloc[0])
    assert tps["speedup"].iloc[1:].tolist() == pytest.approx([1.0, 140.0 / 120.0])
    # the base is named: in the CSV, and on its bar (a "1.00x" on the second step, unnamed,
    # read as the first step's speed)
    assert pd.isna(tps["speedup_over"].iloc[0])
    assert tps["speedup_over"].iloc[1:].tolist() == ["+ burst backward"] * 2
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "1.00x (base)" in texts and "1.17x" in texts, texts
    assert set(data[data["metric"] != "tokens_per_s"]["speedup_over"].isna()) == {True}


def test_titles_and_axes_state_what_is_drawn(committed, fixture_tables):
    from paper_figures import main_throughput

    _, drawn = committed
    title = drawn["kernel_tflops"][0].axes[0].get_title()
    for words in ("40 heads \u00d7 128", "causal", "bf16", "backward = 2.5 \u00d7 forward",
                  "causal = half of N\u00b2"):
        assert words in title, (words, title)
    weak = drawn["weak_scaling"][0]
    assert weak.axes[1].get_ylabel() == "MFU (model FLOPs, causal) %"
    assert weak.axes[1].get_ylabel() == drawn["main_throughput"][0].axes[4].get_ylabel()

    def promised(fig) -> bool:
        texts = [fig._suptitle.get_text()] + [t.get_text() for lg in fig.legends
                                               for t in lg.get_texts()]
        return any("measured" in t for t in texts)

    assert not promised(drawn["main_throughput"][0])  # no GPU rows committed
    assert not promised(main_throughput.make(fixture_tables)[0])
    sim = fixture_tables.simulated
    a800 = sim[(sim["sweep"] == "paper_main_7b") & (sim["world"] == 32)].assign(
        source="measured", device="cuda", hardware="NVIDIA A800-SXM4-80GB")
    tables = _with(fixture_tables, measured=pd.concat([fixture_tables.measured, a800]))
    assert promised(main_throughput.make(tables)[0])
    # the line figures too (their measured squares had no word in title or legend, and a
    # measured failure sat where a simulated one of the same line does: a figures audit)
    from paper_figures import kernel_tflops, weak_scaling

    assert "measured" not in drawn["kernel_tflops"][0].axes[0].get_title()
    assert "measured" not in drawn["weak_scaling"][0]._suptitle.get_text()
    rows = sim[sim["sweep"].isin(["paper_kernel_32gpu", "paper_weak_scaling"])].assign(
        source="measured", device="cuda", hardware="NVIDIA A800-SXM4-80GB")
    tables = _with(fixture_tables, measured=pd.concat([fixture_tables.measured, rows]))
    fig, data = kernel_tflops.make(tables)
    assert "measured on GPUs" in fig.axes[0].get_title()
    assert "measured on GPUs" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert (data["source"] == "measured").any()
    fig, data = weak_scaling.make(tables)
    assert "measured on GPUs" in fig._suptitle.get_text()
    # every failed cell its own mark: a measured copy of a simulated failure is not hidden
    marks = {(float(x), round(float(y), 4)) for coll in fig.axes[0].collections
             for x, y in coll.get_offsets()}
    failed = data[(data["metric"] == "tokens_per_s") & (data["status"] != "ok")]
    assert (failed["source"] == "measured").sum() == (failed["source"] == "simulated").sum() > 0
    assert len(marks) == len(failed)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_cpu_figure_shows_methods_with_equal_values_apart(committed):
    """ring, burst[bwd=ring] and zigzag_ring send the same bytes: each has its own marker and
    line style, and the panel names the methods drawn over each other; ranks are 2, 4, 8."""
    from paper_figures.cpu_sweep import coinciding

    fig, data = committed[1]["cpu_sweep"]
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        styles = [(ln.get_linestyle(), ln.get_linewidth(), ln.get_marker()) for ln in lines]
        assert len(set(styles)) == len(styles), ax.get_title()
    top_left, top_right, low_left, low_right = fig.axes
    for ax in (top_left, top_right):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8"]
    notes = {ax: " ".join(t.get_text() for t in ax.texts) for ax in fig.axes}
    assert "burst[bwd=ring] = ring = zigzag_ring" in notes[top_left]
    assert "burst[bwd=ring] = ring" in notes[low_left]
    assert "burst[bwd=ring] = ring" in notes[low_right]
    legends = [[(h.get_marker(), h.get_linestyle()) for h in ax.get_legend().legend_handles]
               for ax in (top_left, low_right)]
    assert all(len(set(lg)) == len(lg) for lg in legends)
    d = pd.DataFrame({"label": ["a", "b", "c"] * 2, "system": ["a", "b", "c"] * 2,
                      "source": "simulated", "status": "ok", "x": [1, 1, 1, 2, 2, 2],
                      "v": [1.0, 1.0, 2.0, 3.0, 3.0, 3.0]})
    assert coinciding(d, "x", "v") == [["a", "b"]]


def test_the_gpu_check_runs_feed_no_figure(committed):
    """results/gpu's runs (read by the results store since they carry cell ids) stay out of the
    figures' tables: their test rows have no length, which turned every measured length into a
    float and the figures' CSVs stale."""
    tables, _ = committed
    assert len(tables.measured) and "gpu_check" not in set(tables.measured["sweep"])
    assert pd.api.types.is_integer_dtype(tables.measured["seq_len"])


def test_the_committed_figures_are_current(committed):
    """paper_figures/out/*.csv are what the committed results/ tables draw today: after a
    change to a figure or a table, run ``python -m paper_figures`` and commit out/."""
    import io

    from paper_figures.common import OUT

    _, drawn = committed
    for name, (_, data) in drawn.items():
        now = pd.read_csv(io.StringIO(data.to_csv(index=False)))
        committed_csv = pd.read_csv(OUT / f"{name}.csv")
        pd.testing.assert_frame_equal(now, committed_csv, check_exact=False, rtol=1e-9,
                                      obj=f"{name}.csv (stale: run python -m paper_figures)")


def test_the_committed_run_tables_are_current():
    """Every committed run's table.csv is what its rows make today: a column added to the
    schema left old tables without it, and reading such a run (``burst-bench run cpu_long``,
    "nothing to run") rewrote them, leaving the checkout dirty (a README audit). After a change
    to the table, consolidate the committed runs (``results.store.consolidate``) and commit."""
    from results import store

    runs = [p.parent for p in (ROOT / "results").glob("**/rows.jsonl")
            if (p.parent / "table.csv").exists()]
    assert len(runs) >= 10, runs
    stale = [str(r.relative_to(ROOT)) for r in runs
             if (r / "table.csv").read_text()
             != store.consolidate(r, write=False).to_csv(index=False)]
    assert not stale, f"stale tables (consolidate them): {stale}"


def test_simulating_the_committed_sweeps_again_leaves_their_runs_as_committed(tmp_path):
    """``make figures`` (and ``burst-bench simulate SPEC --out results/simulated``) on a clean
    checkout leaves every committed simulated run byte for byte as it is: a run is rewritten
    when anything but its date and commit differs, and the rows' ``spec`` JSON had gained a key
    (``model_config``) since they were written, so the command dirtied the checkout though no
    number moved (a figures audit). After a change to what a row holds, simulate the committed
    sweeps again and commit them."""
    import shutil

    from suites.simulate import simulate_spec

    stored = ROOT / "results" / "simulated"
    sweeps = sorted(p.name for p in stored.iterdir() if (p / "simulated-a800").is_dir())
    assert len(sweeps) >= 10, sweeps
    copy = tmp_path / "simulated"
    shutil.copytree(stored, copy)
    for name in sweeps:
        simulate_spec(name, "a800", out_dir=copy)
    changed = [str(p.relative_to(copy)) for p in sorted(copy.rglob("*")) if p.is_file()
               and p.read_bytes() != (stored / p.relative_to(copy)).read_bytes()]
    assert not changed, f"re-simulated runs differ from the committed ones: {changed}"


def test_a_sweep_no_figure_draws_is_named():
    """A user's own sweep in --results drew nothing and the command said nothing."""
    from paper_figures.make import drawn_sweeps, unused_sweeps

    assert {"paper_main_7b", "paper_kernel_32gpu", "cpu_scaling"} <= drawn_sweeps()
    mine = pd.DataFrame({"sweep": ["mysweep", "cpu_scaling"]})
    (note,) = unused_sweeps(Tables(measured=mine))
    assert "no figure draws sweep(s) mysweep" in note
    assert unused_sweeps(Tables(measured=mine[mine.sweep == "cpu_scaling"])) == []


def test_figures_only_does_not_note_the_sweeps_of_other_figures(tmp_path, capsys):
    """A walkthrough: `figures --only kernel_tflops` named the sweeps no figure draws (smoke, ...)
    although one figure was asked for."""
    from paper_figures.make import main

    assert main(["--only", "kernel_tflops", "--out", str(tmp_path)]) == 0
    assert "no figure draws sweep" not in capsys.readouterr().err


def test_the_reference_tables_are_the_papers():
    """results/paper_reference holds copies of the task's published tables
    (../shared/paper_reference); the figures' and the fit's published values are read from the
    copies, so a copy changed by hand would move both unnoticed."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    shared = root.parent / "shared" / "paper_reference"
    if not shared.is_dir():
        pytest.skip(f"no {shared} next to this checkout")
    csvs = sorted(shared.glob("*.csv"))
    assert csvs
    for f in csvs:
        assert (root / "results" / "paper_reference" / f.name).read_bytes() == f.read_bytes(), f


def test_the_published_numbers_are_read_from_the_repository_alone(tmp_path, monkeypatch):
    """An environment variable, BURST_PAPER_REFERENCE, pointed results.paper at another folder:
    the figures and the fit then drew numbers from outside the repository without a word (an
    audit changed one and saw it in main_throughput.csv)."""
    import shutil

    from results import paper

    want = paper.paper_rows()
    other = tmp_path / "reference"
    shutil.copytree(paper.PAPER_DIR, other)
    text = (other / paper.MAIN_CSV).read_text()
    (other / paper.MAIN_CSV).write_text(text.replace("100.1", "150.0"))
    assert paper.paper_rows(other) != want  # the copy differs, read when named
    monkeypatch.setenv("BURST_PAPER_REFERENCE", str(other))
    assert paper.paper_rows() == want


def test_published_rows_take_the_profiles_peak_and_the_models_shapes():
    """results.paper wrote the A800 peak and the models' heads a second time; the peak stays
    a constant there (results does not import suites) and must equal the profile's."""
    from burst.engine.configs import get_config
    from burst.flops import peak_tflops
    from results.paper import PEAK_TFLOPS
    from suites.hardware import load

    assert load("a800").peak_tflops == PEAK_TFLOPS == peak_tflops("NVIDIA A800-SXM4-80GB")
    for r in paper_rows():
        assert r["peak_tflops"] == PEAK_TFLOPS
        if r["workload"] == "train_step":
            cfg = get_config(r["model"])
            assert (r["heads"], r["head_dim"]) == (cfg.num_heads, cfg.head_dim)


# ---- provenance by the source column, and a word for every figure that has nothing to draw

def test_rows_are_measured_or_simulated_by_their_source_column_not_their_folder(tmp_path,
                                                                                capsys):
    """`simulate --out sim` then `figures --results sim`: the simulated rows were read as
    measured, dropped from every figure, and the command said nothing (a legend warning only)."""
    import warnings

    from paper_figures.make import main
    from paper_figures.tables import load_tables
    from results import store
    from suites.simulate import simulate_spec

    simulate_spec("paper_kernel_32gpu", "h200", tmp_path / "sim")
    simulate_spec("paper_kernel_32gpu", "a800", tmp_path / "a800")
    tables = load_tables(tmp_path / "sim")
    assert len(tables.simulated) == 16 and not len(tables.measured)
    assert set(tables.simulated["hardware"]) == {"h200"}
    assert any("holds only h200" in n for n in tables.notes), tables.notes
    # one level further down (a folder of sweep folders, as results/simulated is), read too
    assert len(load_tables(tmp_path).simulated) == 32
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No artists with labels")
        assert main(["--results", str(tmp_path / "sim"), "--out", str(tmp_path / "f"),
                     "--only", "kernel_tflops"]) == 0
    err = capsys.readouterr().err
    assert "kernel_tflops: nothing of sweep(s) paper_kernel_32gpu to draw" in err, err
    assert "simulated on h200" in err and "no figure draws" not in err, err
    # on the paper's profile the same layout is drawn: lines, and no note
    assert main(["--results", str(tmp_path / "a800"), "--out", str(tmp_path / "g"),
                 "--only", "kernel_tflops"]) == 0
    assert "kernel_tflops" not in capsys.readouterr().err
    kern = pd.read_csv(tmp_path / "g" / "kernel_tflops.csv")
    assert (kern["source"] == "simulated").sum() == 16
    # a row without a source keeps the folder's meaning: simulated under results/simulated
    row = {k: v for k, v in simulate_spec("paper_kernel_32gpu", "a800")[0].items()
           if k != "source"}
    for where, tflops in (("simulated/mine", 1.0), ("mine", 2.0)):
        run = tmp_path / "res" / where / "run0"
        run.mkdir(parents=True)
        store.append_row(run / store.ROWS, dict(row, attn_tflops=tflops))
    tables = load_tables(tmp_path / "res")
    assert list(tables.simulated["attn_tflops"]) == [1.0]
    assert list(tables.measured["attn_tflops"]) == [2.0]


def test_a_figure_with_nothing_to_draw_says_so(fixture_tables):
    from paper_figures.make import undrawn

    assert undrawn(fixture_tables) == []
    sim = fixture_tables.simulated.assign(hardware="h100")
    notes = undrawn(_with(fixture_tables, simulated=sim), only=["kernel_tflops", "cpu_sweep"])
    (kern,) = notes  # the CPU figure draws its measured rows still
    assert kern.startswith("kernel_tflops: nothing of sweep(s) paper_kernel_32gpu to draw")
    assert "simulated on h100" in kern
    notes = undrawn(Tables(paper=fixture_tables.paper))
    names = {n.split(":")[0] for n in notes}
    assert names == {"main_throughput", "memory_bars", "ablation", "weak_scaling",
                     "kernel_tflops", "cpu_sweep",
                     "attention_share, logits_memory, checkpoint_memory"}, notes
    assert all("\n" not in n for n in notes)
    # each names what it draws: the CPU figure measured runs, the ablation the simulation
    found = _with(fixture_tables, simulated=sim)
    (cpu,) = undrawn(_with(found, measured=found.measured.iloc[:0]), only=["cpu_sweep"])
    assert "the figure draws measured runs (CPU ranks, any machine)" in cpu, cpu
    (abl,) = undrawn(_with(found, simulated=sim[sim["sweep"] == "paper_ablation"]),
                     only=["ablation"])
    assert "the figure draws the a800 simulation alone" in abl, abl


def test_sweeps_where_every_cell_failed_render_with_their_marks(fixture_tables, tmp_path):
    """Weak scaling with every cell OOM (a log axis without a positive value) and a CPU sweep
    where no measured cell ran (no baseline) raised; each now renders its failure rows. A
    label with no number still has its legend entry, and a method that ran where the
    baseline did not gets 'no baseline', not a blank speedup."""
    from paper_figures import kernel_tflops, weak_scaling

    sim = fixture_tables.simulated.copy()
    weak = sim["sweep"] == "paper_weak_scaling"
    sim.loc[weak, "status"] = "oom"
    measured = fixture_tables.measured.copy()
    scaling = measured["sweep"] == "cpu_scaling"
    measured.loc[scaling, "status"] = "timeout"
    done = render_all(_with(fixture_tables, simulated=sim, measured=measured), tmp_path,
                      only=["weak_scaling", "cpu_sweep"])
    w = _csv(done, "weak_scaling")
    assert (w["status"] == "oom").all() and w["value"].isna().all() and len(w) == 12
    c = _csv(done, "cpu_sweep")
    speed = c[(c["sweep"] == "cpu_scaling") & c["metric"].str.startswith("speedup")]
    assert len(speed) == 6 and (speed["status"] == "timeout").all()

    fig, _ = weak_scaling.make(_with(fixture_tables, simulated=sim))
    assert sorted(fig.axes[0].get_legend_handles_labels()[1]) == ["burstengine", "megatron_cp"]
    fig, _ = kernel_tflops.make(Tables(paper=fixture_tables.paper))  # published only
    assert set(fig.axes[0].get_legend_handles_labels()[1]) >= {
        "BurstAttention", "LoongTrain-USP", "LoongTrain-DoubleRing", "Megatron-CP"}

    measured = fixture_tables.measured.copy()
    measured.loc[scaling & (measured["label"] == "ring") & (measured["world"] == 4),
                 "status"] = "timeout"
    c = _csv(render_all(_with(fixture_tables, measured=measured), tmp_path,
                        only=["cpu_sweep"]), "cpu_sweep")
    at4 = c[(c["metric"] == "speedup_vs_ring") & (c["world"] == 4)].set_index("label")
    assert at4.loc["burst", "status"] == "no baseline" and pd.isna(at4.loc["burst", "value"])
    assert at4.loc["ring", "status"] == "timeout"


def test_line_figures_mark_a_cell_that_ran_without_a_number(fixture_tables):
    """An ok row without the plotted number (MFU on a GPU no profile gives a peak for, an
    attention rate not recorded) is marked at the floor as 'no value' in the line figures, as
    the bar figures say it, not left as a silent gap."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    from paper_figures import kernel_tflops, weak_scaling

    def marks(fig, i):
        return sum(isinstance(c, PathCollection) and len(c.get_offsets())
                   for c in fig.axes[i].collections)

    plt.close("all")  # what earlier tests' make() calls left open

    sim = fixture_tables.simulated.copy()
    weak = sim.index[(sim["sweep"] == "paper_weak_scaling") & (sim["status"] == "ok")][0]
    kern = sim.index[(sim["sweep"] == "paper_kernel_32gpu") & (sim["status"] == "ok")][0]
    sim.loc[weak, "mfu_model_flops_causal"] = float("nan")
    sim.loc[kern, "attn_tflops"] = float("nan")
    gap = _with(fixture_tables, simulated=sim)
    before, _ = weak_scaling.make(fixture_tables)
    fig, data = weak_scaling.make(gap)
    assert marks(fig, 1) == marks(before, 1) + 1 and marks(fig, 0) == marks(before, 0)
    plt.close(before)
    row = data[(data["world"] == sim.loc[weak, "world"]) & (data["label"] == sim.loc[weak, "label"])
               & (data["source"] == "simulated")].set_index("metric")
    assert row.loc["mfu_model_flops_causal", "status"] == "no value"
    assert row.loc["tokens_per_s", "status"] == "ok"
    assert "* ran, no number" in fig._suptitle.get_text()
    plt.close(fig)
    before, _ = kernel_tflops.make(fixture_tables)
    fig, data = kernel_tflops.make(gap)
    assert marks(fig, 0) == marks(before, 0) + 1
    plt.close(before)
    assert data[(data["seq_len"] == sim.loc[kern, "seq_len"]) & (data["label"] == sim.loc[
        kern, "label"]) & (data["source"] == "simulated")]["status"].tolist() == ["no value"]
    assert "* ran, no number" in fig.axes[0].get_title()
    plt.close(fig)


def test_footnotes_say_which_bars_are_another_model(committed):
    """BurstEngine's 7B runs built a GELU MLP (suites/implementations.toml): the bar figures'
    footnote names its simulated and published labels at 7B, and nothing for its 14B (SwiGLU,
    as configured) or for a measured row (this project's engine builds the config); the 7B
    weak-scaling lines say it too."""
    from paper_figures._bars import status_note

    fig, _ = committed[1]["weak_scaling"]
    assert any("Burst-Ring, Burst-USP at 7B: the system's own config, a two-matrix GELU MLP"
               in " ".join(t.get_text().split()) for t in fig.texts)

    def row(label, system, model, source):
        return dict(label=label, system=system, model=model, source=source, status="ok",
                    error=None, checkpointing="selective")

    df = pd.DataFrame([row("Burst-Ring", "burstengine", "7b", "simulated"),
                       row("Burst-USP", "burstengine_usp", "7b", "paper"),
                       row("LoongTrain-Ring", "loongtrain_double_ring", "7b", "simulated"),
                       row("Burst-Ring", "burstengine", "14b", "simulated")])
    note = status_note(df)
    assert note.startswith("Burst-Ring, Burst-USP at 7B: the system's own config, a two-matrix "
                           "GELU MLP (5.30B parameters; the others SwiGLU, 6.74B)")
    assert note.endswith("its MFU counts the SwiGLU model's FLOPs, as the paper's does")
    # a figure without MFU (the memory bars) says nothing of it
    assert status_note(df, mfu=False).endswith("6.74B), priced as built")
    fig, _ = committed[1]["memory_bars"]
    said = " ".join(" ".join(t.get_text().split()) for t in fig.texts)
    assert "priced as built" in said and "MFU" not in said
    assert "14B" not in note and "LoongTrain" not in note
    assert status_note(df[df["model"] == "14b"]) == ""
    assert status_note(df.assign(source="measured")) == ""


def test_no_legend_warning_from_a_figure_without_labelled_series(fixture_tables, tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No artists with labels")
        render_all(Tables(paper=fixture_tables.paper), tmp_path)
        render_all(Tables(), tmp_path)


def test_the_cpu_figure_names_the_folder_it_read(fixture_tables, tmp_path):
    """Its empty panels said 'no measured CPU sweep ... in results/' whatever --results read."""
    import warnings

    from paper_figures import cpu_sweep
    from paper_figures.tables import load_tables

    (tmp_path / "r2" / "simulated").mkdir(parents=True)
    fixture_tables.breakdowns.to_csv(tmp_path / "r2" / "simulated" / "breakdowns.csv")
    tables = load_tables(tmp_path / "r2")
    with warnings.catch_warnings():  # a long path must not widen the panel
        warnings.filterwarnings("error", message="Tight layout not applied")
        fig, _ = cpu_sweep.make(tables)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    folder = f"{tmp_path / 'r2'}/"
    assert len(texts) == 4 and all(folder in t.replace("\n", "") for t in texts), texts
    assert not any("results/" in t for t in texts)
    from paper_figures.common import wrap_path

    assert wrap_path("/a/bb/ccc/d", 6) == "/a/bb/\nccc/d" and wrap_path("x/", 6) == "x/"


def test_one_sequence_label_everywhere():
    """Figures, the simulator's doc and the fit table each formatted lengths; the doc's rounded
    1.5M down to "1M". One function now, exact."""
    from results.tables import seq_label

    assert [seq_label(n) for n in (1000, 4096, 1 << 20, 3 << 19, 4 << 20, 1536.0)] == \
        ["1000", "4K", "1M", "1536K", "4M", "1536"]


def test_every_coloured_method_has_a_place_in_the_order():
    """ORDER ranks the bars and lines; a method missing from it (ring_flash_attn and yunchang
    were) was drawn after every other, wherever it belonged."""
    from paper_figures import palette

    assert set(palette.ORDER) == set(palette.COLORS) and len(set(palette.ORDER)) == len(
        palette.ORDER)


def test_footnotes_say_why_cells_have_no_number():
    """The bar and line figures tagged SKIPPED, MISSING and their failure marks without a
    word of why (a visual review): the footnotes quote each label's first row's error."""
    import pandas as pd

    from paper_figures._bars import failure_note, status_note

    skip = ("method 'ulysses' cannot run this case: ulysses degree (group size) 64 does not "
            "divide 32 query heads; valid degrees: 1, 2")
    df = pd.DataFrame([
        dict(source="simulated", label="Megatron", system="megatron_cp", checkpointing=None,
             world=1, status="oom", error="predicted OOM: 145 GiB reserved > 78.5 GiB usable"),
        dict(source="simulated", label="Megatron", system="megatron_cp", checkpointing=None,
             world=2, status="oom", error="predicted OOM: 104 GiB reserved > 78.5 GiB usable"),
        dict(source="simulated", label="Megatron", system="megatron_cp", checkpointing=None,
             world=4, status="ok", error=None),
        dict(source="simulated", label="Deepspeed-Ulysses", system="deepspeed_ulysses",
             checkpointing=None, world=64, status="skipped", error=skip),
        dict(source="paper", label="Megatron", system="megatron_cp", checkpointing=None,
             world=64, status="missing", error=None),
    ])
    note = failure_note(df)
    # the reason is the first cell's, and says so (its 145 GiB is not the 2-GPU cell's)
    assert ("Megatron: oom at 1, 2 GPUs (at 1: predicted OOM: 145 GiB reserved > 78.5 GiB "
            "usable)") in note
    assert ("Deepspeed-Ulysses: skipped at 64 GPUs (ulysses degree (group size) 64 does not "
            "divide 32 query heads)") in note
    said = status_note(df)
    assert "SKIPPED (Deepspeed-Ulysses)" in said and "64 does not divide 32 query heads" in said
    # each distinct reason once: the 14B panels skip for another than the 7B one (an audit)
    other = skip.replace("32 query", "40 query")
    said = status_note(pd.concat([df, df.iloc[[3, 3]].assign(error=other, world=32)]))
    assert said.count("64 does not divide 32 query heads") == 1 and said.count(
        "64 does not divide 40 query heads") == 1, said
    assert "paper MISSING" in said
    assert failure_note(df[df["status"] == "ok"]) == "" and status_note(df.iloc[:3]) == ""


# ---------------------------------------------------------------------------------------------
# the data path of each figure, against the committed tables changed one way (found by a
# mutation audit: each of these slips changed a figure or its CSV and no test)

def _lines_max(fig) -> float:
    return max(max(ln.get_ydata()) for ax in fig.axes for ln in ax.get_lines()
               if not ln.get_label().startswith("_") and len(ln.get_ydata()))


def test_analytic_curves_are_drawn_in_their_axis_units(committed):
    """attention_share draws percent of its CSV's fraction, checkpoint_memory its GiB column
    (fractions and bytes were drawn on the same axes)."""
    _, drawn = committed
    fig, data = drawn["attention_share"]
    assert _lines_max(fig) == pytest.approx(100 * data["value"].max())
    fig, data = drawn["checkpoint_memory"]
    assert _lines_max(fig) == pytest.approx(data["GiB"].max())


def test_a_peak_above_the_axis_keeps_its_value_in_the_csv(committed):
    """A predicted peak beyond the memory axis (drawn clipped) is written whole."""
    from paper_figures import memory_bars

    t, _ = committed
    sim = t.simulated.copy()
    at = (sim["sweep"] == "paper_main_7b") & (sim["world"] == 32) & (sim["label"] == "Megatron")
    assert at.sum() == 1
    sim.loc[at, ["status", "mem_reserved_bytes"]] = ["oom", 200 * 2**30]
    d = _data(memory_bars, _with(t, simulated=sim))
    v = d[(d.model == "7b") & (d.world == 32) & (d.label == "Megatron")
          & (d.source == "simulated")]
    assert list(v["value"]) == [200.0]


def test_ablation_draws_the_a800_simulation_whatever_else_was_measured(committed):
    """A measured run of the ablation sweep on an A800 does not replace its simulated bars."""
    from paper_figures import ablation

    t, drawn = committed
    sim = t.simulated[t.simulated["sweep"] == "paper_ablation"]
    measured = sim.assign(source="measured", device="cuda", hardware="NVIDIA A800-SXM4-80GB",
                          tokens_per_s=1.0)
    d = _data(ablation, _with(t, measured=measured))
    want = drawn["ablation"][1]
    assert d["value"].tolist() == pytest.approx(want["value"].tolist(), nan_ok=True)


def test_cpu_figure_keeps_to_its_profile_and_its_measured_length(committed):
    """Another profile's simulation of cpu_scaling, or one at another length, changes nothing
    the CPU figure draws (the first doubled its formula rows, the second emptied its measured
    panels); a cell that timed out has no value in the CSV, as it has none in the figure.
    (The other profile's rows come last and differ: since the figure keeps a point's last row,
    equal ones would hide a figure that drew any profile.)"""
    from paper_figures import cpu_sweep

    t, drawn = committed
    want = drawn["cpu_sweep"][1]
    sim = t.simulated
    scaling = sim[sim["sweep"] == "cpu_scaling"]
    other = scaling.assign(hardware="h100", bytes_sent_forward=scaling["bytes_sent_forward"] * 2)
    for extra, source in ((other, "simulated"),
                          (scaling.assign(seq_len=scaling["seq_len"] * 2), "measured")):
        d = _data(cpu_sweep, _with(t, simulated=pd.concat([sim, extra])))
        got, ref = (df[(df.sweep == "cpu_scaling") & (df.source == source)].reset_index(drop=True)
                    for df in (d, want))
        assert len(got) == len(ref) > 0, (source, len(got), len(ref))
        pd.testing.assert_frame_equal(got, ref, check_dtype=False, obj=source)
    measured = t.measured.copy()
    at = ((measured["sweep"] == "cpu_scaling") & (measured["label"] == "burst")
          & (measured["world"] == 4))
    assert at.any()
    measured.loc[at, "status"] = "timeout"
    d = _data(cpu_sweep, _with(t, measured=measured))
    v = d[(d.sweep == "cpu_scaling") & (d.source == "measured") & (d.label == "burst")
          & (d.world == 4)]
    assert len(v) and (v["status"] == "timeout").all() and v["value"].isna().all()


def test_a_label_full_recomputed_in_any_source_is_hatched():
    from paper_figures._bars import label_checkpointing

    df = pd.DataFrame({"label": ["X", "X"], "checkpointing": ["selective", "full"]})
    assert label_checkpointing(df, "X") == "full"
    assert label_checkpointing(df.iloc[::-1], "X") == "full"


def test_a_saved_figure_has_no_creation_date(tmp_path, monkeypatch):
    """common.save promises that a figure whose data did not change regenerates byte for byte
    (paper_figures/out/*.pdf are committed): the PDF must carry no creation date. No test held
    it (dropping metadata={"CreationDate": None} passed every test: a mutation audit)."""
    from paper_figures.common import new_figure, save

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)  # (matplotlib's fixed date)
    fig, axes = new_figure()
    axes[0][0].plot([1, 2], [3, 4])
    png, pdf, csv = save(fig, pd.DataFrame({"x": [1, 2]}), "t", tmp_path)
    assert b"/CreationDate" not in pdf.read_bytes()
    assert pd.read_csv(csv).to_dict("list") == {"x": [1, 2]}


def test_a_memory_panel_names_the_gpus_of_its_own_rows():
    """checkpoint_memory labelled every panel with the first row's world of the whole table
    (right only while every model was priced on one world), and the OOM line said A800 for any
    profile it was given."""
    import matplotlib.pyplot as plt

    from paper_figures import checkpoint_memory
    from suites.hardware import load

    rows = (breakdown_rows(models=("7b",), seq_lens=(1 << 14,), world=32)
            + breakdown_rows(models=("14b",), seq_lens=(1 << 14,), world=64))
    fig, _ = checkpoint_memory.make(Tables(paper=pd.DataFrame(), simulated=pd.DataFrame(),
                                           measured=pd.DataFrame(),
                                           breakdowns=pd.DataFrame(rows)))
    assert [ax.get_xlabel() for ax in fig.axes] == [
        "sequence length (tokens), 32 GPUs", "sequence length (tokens), 64 GPUs"]
    plt.close(fig)
    from paper_figures.common import memory_axes, new_figure

    fig, axes = new_figure()
    memory_axes(axes[0][0], load("h100"), [8, 16, 8], "GiB")
    assert axes[0][0].get_xlabel() == "sequence length (tokens), 8/16 GPUs"
    assert any(ln.get_label().startswith("usable on an H100 (") for ln in axes[0][0].get_lines())
    plt.close(fig)
