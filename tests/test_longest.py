"""suites.longest: the longest sequence a cell fits, searched over the simulator's predictions.

The search is checked against the pointwise predictions it is built on: the length it returns
is ok and the next grid length is not; every cell of the paper's training specs is ok exactly
when its length is at most the search's answer; and the assumption the search rests on (nothing
fits past the first length that does not) holds on a scan of every paper cell.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from suites.cells import expand
from suites.hardware import load
from suites.longest import longest, longest_spec, longest_table
from suites.simulate import main as simulate_main
from suites.simulate import predict, simulate_cell
from suites.spec import load_spec

HW = load("a800")
SPECS = ("paper_main_7b", "paper_main_14b")


def _cell(spec: str, label: str, world: int):
    return next(c for c in expand(load_spec(spec)) if c.label == label and c.world == world)


@pytest.fixture(scope="module")
def fits():
    return {name: longest_spec(name, HW) for name in SPECS}


def test_the_answer_fits_and_the_next_length_does_not():
    c = _cell("paper_main_7b", "Burst-Ring", 32)
    f = longest(c, HW)
    step = 1024 * c.world
    assert f.seq_len is not None and f.seq_len % step == 0 and f.stop_len == f.seq_len + step
    assert f.row["status"] == "ok" and f.row["seq_len"] == f.seq_len
    assert predict(dataclasses.replace(c, seq_len=f.seq_len), HW).status == "ok"
    nxt = predict(dataclasses.replace(c, seq_len=f.stop_len), HW)
    assert nxt.status == "oom" and f.stop == f"oom: {nxt.error}"
    # the paper ran this cell at 2M tokens; the search finds more room above it
    assert f.seq_len > c.seq_len
    # a finer grid lands within one coarse step of the coarse answer
    fine = longest(c, HW, unit=256)
    assert f.seq_len <= fine.seq_len < f.stop_len


def test_every_paper_cell_is_ok_exactly_up_to_the_longest_fit(fits):
    """Pointwise predictions at the specs' own lengths agree with the search."""
    for name in SPECS:
        by_key = {(f.cell.label, f.cell.world): f for f in fits[name]}
        for c in expand(load_spec(name)):
            f = by_key[(c.label, c.world)]
            ok = predict(c, HW).status == "ok"
            assert ok == (f.seq_len is not None and c.seq_len <= f.seq_len), (name, c.label)


def test_nothing_fits_past_the_first_length_that_does_not(fits):
    """The search's assumption, on a scan of every paper cell up to twice its stop length:
    the statuses are ok, then never ok again, and the reserved memory does not fall."""
    for name in SPECS:
        for f in fits[name]:
            step = 1024 * f.cell.world
            top = 2 * f.stop_len // step
            seen_bad, last_mem = False, 0
            for k in range(1, top + 1, max(1, top // 48)):
                p = predict(dataclasses.replace(f.cell, seq_len=k * step), HW)
                assert not (seen_bad and p.status == "ok"), (name, f.cell.label, k)
                seen_bad |= p.status != "ok"
                if p.memory is not None:
                    assert p.memory.reserved >= last_mem, (name, f.cell.label, k)
                    last_mem = p.memory.reserved


def test_cells_that_fit_nothing_say_why(fits):
    by_label = {(f.cell.label, f.cell.world): f for f in fits["paper_main_14b"]}
    meg = by_label[("Megatron", 32)]  # weights and optimizer alone exceed the GPU
    assert meg.seq_len is None and meg.row["status"] == "oom" and meg.row["seq_len"] == 32 * 1024
    assert meg.stop.startswith("oom: predicted OOM")
    ds = by_label[("Deepspeed-Ulysses", 32)]  # 40 heads over 32 ranks: skip_invalid in the spec
    assert ds.seq_len is None and ds.row["status"] == "skipped"
    assert "does not divide 40 query heads" in ds.stop
    # the same cell outside the spec is an error, as simulate_cell makes it
    assert longest(ds.cell, HW).row["status"] == "error"


def test_the_model_configs_guard_ends_a_search_that_memory_does_not(fits):
    by_label = {(f.cell.label, f.cell.world): f for f in fits["paper_main_7b"]}
    f = by_label[("Burst-Ring", 64)]
    assert f.seq_len == 1 << 22 and "max_seq_len" in f.stop and f.stop.startswith("error:")
    assert f.row["mem_reserved_bytes"] < 0.8 * HW.usable_bytes


def test_the_table_has_a_line_per_cell(fits):
    table = longest_table(fits["paper_main_7b"]).splitlines()
    assert len(table) == 2 + len(fits["paper_main_7b"])
    assert sum(line.startswith("| Burst-Ring | 7b | 32 | selective | ") and "M (" in line
               for line in table) == 1
    assert any(line.startswith("| Megatron | 7b | 32 |") for line in table)


@pytest.mark.parametrize("unit", [0, -1024, True, 1.5, 1, 3])
def test_a_bad_unit_is_refused(unit):
    with pytest.raises(ValueError, match="unit="):
        longest(_cell("paper_main_7b", "Burst-Ring", 32), HW, unit=unit)


def test_cli_prints_and_writes_the_longest_fits(tmp_path, capsys, fits):
    rc = simulate_main(["paper_main_7b", "--longest", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [x for x in out.splitlines() if "world=" in x]
    assert len(lines) == len(fits["paper_main_7b"])
    assert sum("longest fit" in x for x in lines) == sum(
        f.seq_len is not None for f in fits["paper_main_7b"])
    assert any("seq=       - world= 64 nothing fits (shortest on the grid: 65536); skipped" in x
               for x in lines)  # Ulysses on 64 ranks, 32 heads: no length is a fit
    run = tmp_path / "paper_main_7b-longest" / "simulated-a800"
    rows = [json.loads(x) for x in (run / "rows.jsonl").read_text().splitlines()]
    assert [r["seq_len"] for r in rows] == [f.row["seq_len"] for f in fits["paper_main_7b"]]
    assert {r["sweep"] for r in rows} == {"paper_main_7b-longest"}
    assert json.loads(out.splitlines()[-1])["written"] == str(run)


def test_headroom_keeps_a_fraction_of_the_memory_free(tmp_path, capsys):
    """--headroom f: a cell fits within (1 - f) of the usable memory (a planning audit: the
    memory model's worst error is 19.5%, and --longest filled memory to the last grid step)."""
    usable = load("a800").usable_gib

    def fits(*extra):
        out = tmp_path / "rows"  # one folder: the two runs must not share a sweep (a review)
        assert simulate_main(["smoke", "--longest", "--out", str(out), *extra]) == 0
        sweep = "smoke-headroom0.2-longest" if extra else "smoke-longest"
        run = out / sweep / "simulated-a800"
        return {r["label"]: r for r in map(json.loads, (run / "rows.jsonl").read_text()
                                           .splitlines())}

    plain = fits()
    assert "(usable_gib overridden)" not in capsys.readouterr().out
    kept = fits("--headroom", "0.2")
    out = capsys.readouterr().out
    assert "note: --headroom 0.2: 62.80 of the a800 profile's 78.50 usable GiB counted" in out
    # the next length's OOM says the usable memory is not the profile's (a review)
    assert "GiB usable on a800 (usable_gib overridden); allocated" in out
    assert set(plain) == set(kept) and len(kept) > 5
    for label, r in kept.items():
        held = r["mem_reserved_bytes"] / 2**30
        assert held <= 0.8 * usable and r["seq_len"] < plain[label]["seq_len"], label
        assert held > 0.8 * usable * 0.99, label  # as full as the grid allows
    for bad in ("1", "-0.1"):
        with pytest.raises(SystemExit):
            simulate_main(["smoke", "--headroom", bad])
    assert "a fraction of the usable memory, 0 <= f < 1" in capsys.readouterr().err


def test_docs_show_the_longest_fits_of_the_shipped_model(fits):
    """docs/simulator.md's tables (regenerated by ``python -m suites.calibrate``) and the
    README's example are what the shipped profile and systems give now."""

    from suites.simulator_doc import LONGEST_SPECS

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "simulator.md").read_text()
    assert set(LONGEST_SPECS) == set(SPECS)
    for name in SPECS:
        for line in longest_table(fits[name]).splitlines():
            assert line in doc, line
    got = {(f.cell.label, f.cell.world): f.seq_len for f in fits["paper_main_7b"]}
    lt = {got[("LoongTrain-Ring", 32)], got[("LoongTrain-USP", 32)]}
    assert len(lt) == 1
    readme = " ".join((root / "README.md").read_text().split())
    assert (f"7b on 32 A800s, Burst-Ring fits {got[('Burst-Ring', 32)] / 2**20:.2f}M tokens "
            f"with selective checkpointing (Burst-USP {got[('Burst-USP', 32)] / 2**20:.2f}M) "
            f"where LoongTrain-Ring and LoongTrain-USP fit {lt.pop() / 2**20:.2f}M") in readme


def test_readme_plans_llama3_70b_on_h100s():
    """The README's planning example for a model the paper did not train is what the search
    gives now: Llama-3-70B, ZeRO-3 over 64 H100s, selective checkpointing and the fused head."""

    f = longest(dict(workload="train_step", model="llama3-70b", method="burst", world=64,
                     checkpointing="selective", fused_head=True, data_parallel="fsdp_world"),
                "h100")
    r = f.row
    assert r["status"] == "ok" and f.seq_len % (64 * 1024) == 0 and f.stop.startswith("oom")
    held = re.search(r"([\d.]+) GiB reserved", f.stop).group(1)
    ckpt = re.search(r"checkpoints ([\d.]+)", f.stop).group(1)
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert (f"fits {f.seq_len / 2**20:.2f}M tokens on 64 H100s at {r['tokens_per_s']:.1f} tokens/s "
            f"per GPU (MFU {100 * r['mfu_model_flops_causal']:.1f}%;") in readme
    assert f"its checkpoints alone take {ckpt} GiB of the predicted {held} GiB" in readme


def test_a_cell_that_never_runs_out_stops_at_the_search_limit(monkeypatch):
    import suites.longest as L

    monkeypatch.setattr(L, "LIMIT", 100 * 1024)
    cell = {"workload": "attention", "method": "burst", "seq_len": 1024, "world": 1,
            "heads": 1, "head_dim": 8}
    f = longest(cell, HW)
    assert f.seq_len == 100 * 1024 and f.stop_len == 101 * 1024
    assert f.stop == "past the search limit of 102400 tokens" and f.row["status"] == "ok"


def test_a_windowed_cell_that_never_runs_out_stops_where_its_time_can_be_priced(monkeypatch):
    """A tiny windowed cell never runs out of memory, and its time plans kernel tiles per
    token: the search ran to its limit and pricing the length found could exhaust the host. It
    now ends at the most tokens a rank whose time is priced (``MAX_PLANNED_TOKENS``, lowered
    here), priced, and says why it went no further."""
    import suites.schedule as S
    import suites.simulate as P

    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert f"a windowed cell past the {S.MAX_PLANNED_TOKENS // 2**20}M tokens a side" in readme
    monkeypatch.setattr(S, "MAX_PLANNED_TOKENS", 10 * 1024)
    priced = []
    real = P.attention_timing
    monkeypatch.setattr(P, "attention_timing",
                        lambda hw, m, o, shape, *a, **k: priced.append(shape.seq_len)
                        or real(hw, m, o, shape, *a, **k))
    cell = {"workload": "attention", "method": "zigzag_ring", "seq_len": 2048, "world": 2,
            "heads": 1, "head_dim": 8, "causal": True, "window": (1024, 0)}
    f = longest(cell, HW)
    assert priced == [f.seq_len]  # the search stopped at the cap: one length priced
    assert f.seq_len == 2 * 10 * 1024 and f.stop_len == 2 * 11 * 1024
    assert f.row["status"] == "ok" and f.row["time_s"] > 0
    assert f.stop.startswith("error: not priced: a windowed ring plans its kernel tiles per "
                             "token, here 11264 tokens a side"), f.stop


def test_the_search_asks_memory_and_prices_one_length_whole(monkeypatch):
    """The search asks each length whether it runs and fits, not how fast (a windowed ring's
    time plans its kernels' tiles: about 13 s a length at a million tokens per rank, so
    --longest on a windowed attention spec took minutes, an audit found); the length found is
    priced whole, with the answer of a search that prices every length. A length whose time
    alone is an error sends the search round again, whole."""
    import suites.simulate as S

    calls = []
    real = S.attention_timing

    def counted(hw, method, opts, shape, *args, **kwargs):
        calls.append(shape.seq_len)
        if shape.seq_len > limit:
            raise ValueError(f"no time past {limit} tokens")
        return real(hw, method, opts, shape, *args, **kwargs)

    monkeypatch.setattr(S, "attention_timing", counted)
    c = _cell("paper_main_7b", "Burst-Ring", 32)
    limit = 1 << 62
    f = longest(c, HW)
    assert calls == [f.seq_len] and f.row["status"] == "ok"
    assert predict(dataclasses.replace(c, seq_len=f.stop_len), HW).status == "oom"
    limit = f.seq_len // 2  # fits, but has no time past half the answer
    calls.clear()
    g = longest(c, HW)
    assert g.seq_len == limit - limit % (1024 * 32) and g.row["status"] == "ok"
    assert g.stop == f"error: no time past {limit} tokens"
    assert calls[0] == f.seq_len and len(calls) > 10  # the length found, then every length


def test_readme_quotes_this_projects_engine_against_the_papers_system(fits):
    """The README's figures for engine_7b (this project's engine, states whole on every GPU)
    next to the paper's BurstEngine: what the search gives now."""

    ours = {f.cell.label: f.seq_len for f in longest_spec("engine_7b", HW)}
    world = simulate_cell(_cell("engine_7b", "burst, selective, fsdp_world", 32), HW)
    assert world["status"] == "ok" and world["seq_len"] == 1 << 21
    paper = {(f.cell.label, f.cell.world): f.seq_len for f in fits["paper_main_7b"]}
    assert predict(_cell("engine_7b", "burst, selective", 32), HW).status == "oom"
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert (f"up to {ours['burst, selective'] / 2**20:.2f}M tokens with selective checkpointing "
            f"and {ours['burst, full'] / 2**20:.2f}M with full recomputation, where the paper's "
            f"BurstEngine (ZeRO-3, its optimizer on the host, its GELU-MLP 7B) fits "
            f"{paper[('Burst-Ring', 32)] / 2**20:.2f}M") in readme
    assert (f"fits 2M tokens, at {world['tokens_per_s']:.1f} tokens/s per GPU, and up to "
            f"{ours['burst, selective, fsdp_world'] / 2**20:.2f}M") in readme


def test_a_small_even_unit_keeps_every_length_rule():
    """Any even unit is a grid every layout and selective_half accept: 2 tokens per rank on a
    striped ring with the half cache finds a length the Trainer takes, and a cell given
    without its (ignored) seq_len is searched too."""
    from burst.engine.configs import get_config
    from burst.engine.trainer import seq_len_problems

    cell = dict(workload="train_step", method="burst", model="7b", world=8, ranks_per_node=8,
                checkpointing="selective_half", options={"layout": "striped"}, fused_head=True)
    f = longest(cell, HW, unit=2)
    assert f.seq_len and f.seq_len % 16 == 0 and f.stop.startswith("oom")
    assert not seq_len_problems(get_config("7b"), f.seq_len, cp_size=8, layout="striped",
                                checkpointing="selective_half")


def test_each_fit_is_handed_over_as_it_is_found(monkeypatch):
    """`burst-bench simulate --longest` printed nothing until every search was done (each prices
    many lengths: 14 s for 2 cells at 2048 GPUs, a review); ``on_fit`` gets each fit before the
    next search starts, which the CLI prints."""
    import types

    import suites.longest as L

    events = []

    def search(cell, hw, **kw):
        events.append(("searched", cell.label))
        return types.SimpleNamespace(cell=cell, row={"cell_id": cell.cell_id})

    monkeypatch.setattr(L, "longest", search)
    fits = L.longest_spec("cpu_long", HW, on_fit=lambda f: events.append(("fit", f.cell.label)))
    assert len(fits) == 3
    assert events == [e for f in fits for e in (("searched", f.cell.label),
                                                 ("fit", f.cell.label))]


def test_each_node_split_of_one_world_is_searched(monkeypatch, tmp_path):
    """Two scales of 8 GPUs, one node of 8 and two of 4, are two searches (their links and
    memory differ): the second went unsearched, without a row."""
    import types

    import suites.longest as L

    monkeypatch.setattr(L, "longest", lambda cell, hw, **kw: types.SimpleNamespace(
        cell=cell, row={"cell_id": cell.cell_id}))
    spec = tmp_path / "splits.toml"
    spec.write_text('workload = "attention"\nseq_lens = [4096]\n[shape]\nheads = 8\n'
                    'head_dim = 64\n[[methods]]\nname = "burst"\n[[methods]]\nname = "ring"\n'
                    "[[scales]]\nworld = 8\n[[scales]]\nworld = 8\nnodes = 2\n")
    fits = L.longest_spec(str(spec), HW)
    assert sorted((f.cell.label, f.cell.nodes) for f in fits) == [
        ("burst", 1), ("burst", 2), ("ring", 1), ("ring", 2)]

