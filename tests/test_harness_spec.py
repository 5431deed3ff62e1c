"""Harness without ranks (issue 5): spec validation, cell expansion and ids, dry-run, the row
store, tables, the CLI's read-only subcommands. Nothing here spawns a process group."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from burst.engine.configs import get_config
from results import store
from results.schema import COLUMNS, empty_row, markdown_table
from results.tables import add_speedup, compare, summary
from suites import cli
from suites.cells import expand
from suites.executors import dry_run
from suites.rows import classify
from suites.spec import SPEC_DIR, SlurmSpec, SpecError, load_spec

GOOD = """
workload = "attention"
seq_lens = [64, 128]
world = 4
baseline = "burst"
[shape]
heads = 4
head_dim = 16
[[methods]]
name = "burst"
[[methods]]
name = "burst"
options = { backward = "ring", ranks_per_node = "@node" }
label = "burst-ring"
"""

BAD = """
name = "../escaped"
workload = "attention"
dtype = "float33"
repeat = 3
repeats = 0
warmup = -1
timeout_min = 1e12
seq_lens = [64, 100]
world = 4
nodes = 3
baseline = "nobody"
[shape]
heads = 6
kv_heads = 4
[[methods]]
name = "no_such_method"
[[methods]]
name = "burst"
options = { backwards = "ring" }
label = "burst"
[[methods]]
name = "burst"
label = "burst"
checkpointing = "selective"
[slurm]
partition = 3
time_min = 2
setup = ["module load cuda", 2]
"""


GOOD_TINY = """workload = "attention"
seq_lens = [32]
world = 2
[shape]
heads = 2
head_dim = 8
[[methods]]
name = "ring"
"""


def _file_as(out, name="sweep"):
    """An --out folder in which a file stands where the sweep ``name``'s folder would go."""
    out.mkdir(exist_ok=True)
    (out / name).write_text("")
    return out


def _write(tmp_path, text, name="sweep"):
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def test_bad_spec_lists_every_problem(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, BAD))
    probs = ei.value.problems
    want = [
        ("dtype", "'float33' is not valid", "float32"),  # bad value with the valid choices
        ("repeat", "unknown key", "did you mean 'repeats'"),
        ("warmup", "must be >= 0"),
        ("repeats", "must be >= 1"),
        ("timeout_min", "must be <= 10080"),  # 1e12 minutes overflowed timedelta in every cell
        ("nodes", "3 does not divide world=4", "valid: 1, 2, 4"),
        ("baseline", "'nobody' is not a method label"),
        ("shape.kv_heads", "4 does not divide heads=6", "valid: 1, 2, 3, 6"),
        ("methods", "label 'burst' is used by 2 methods"),
        ("methods[2].checkpointing", "only applies to workload = 'train_step'"),
        ("slurm.partition", "3 is of type int; expected str"),
        ("slurm.time_min", "must be >= 3"),  # the warning signal came at the job's start
        ("name", "'../escaped': a sweep name is one folder under results/"),
        ("slurm.setup", "expected a list of shell lines"),
        ("methods[0] (no_such_method).name", "unknown method 'no_such_method'",
         "registered: burst"),
        ("methods[1] (burst).options.backwards", "valid options:", "backward"),
    ]
    for parts in want:
        assert any(all(p in line for p in parts) for line in probs), (parts, probs)
    assert len(probs) == len(want), probs
    # the message carries them all, one per line
    assert str(ei.value).count("\n  - ") == len(probs)
    # a name taken from the file's name says so, and how to set one (it named only the folder
    # rule, as if the file had set it)
    (tmp_path / "my sweep.toml").write_text('workload = "attention"\nseq_lens = [64]\nworld = 2\n'
                                            '[shape]\nheads = 8\nhead_dim = 8\n'
                                            '[[methods]]\nname = "ring"\n')
    with pytest.raises(SpecError) as ei:
        load_spec(tmp_path / "my sweep.toml")
    assert ei.value.problems == ["name: 'my sweep' (the file name: no name set): a sweep name is "
                                 "one folder under results/ (letters, digits, '_', '.', '-'; not "
                                 "starting with '.' or '-'); set name = \"...\""]
    # a world that nodes x gpus_per_node contradicts (it ran at 2 x 4 = 8)
    with pytest.raises(SpecError, match=r"16 != nodes x gpus_per_node = 2 x 4"):
        load_spec(_write(tmp_path, 'name = "x"\nworkload = "attention"\nseq_lens = [64]\n'
                         'world = 16\nnodes = 2\ngpus_per_node = 4\n[shape]\nheads = 8\n'
                         'head_dim = 8\n[[methods]]\nname = "ring"\n'))
    # an unknown method is named whatever else is wrong (it was not, with a bad workload)
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, 'name = "x"\nworkload = "nonsense"\nseq_lens = [64]\n'
                                   '[[methods]]\nname = "nosuch"\n'))
    assert any("unknown method 'nosuch'" in p for p in ei.value.problems), ei.value.problems
    # and so are the [shape]'s and the model's problems (they came a round later)
    for body, wants in (
            ('workload = "atention"\n[shape]\nheds = 8\nhead_dim = "64"\n',
             ("workload", "shape.heds", "shape.head_dim")),
            ('model = "nosuchmodel"\n', ("workload", "model"))):
        with pytest.raises(SpecError) as ei:
            load_spec(_write(tmp_path, 'name = "x"\nseq_lens = [64]\n' + body +
                             '[[methods]]\nname = "ring"\n[[scales]]\nworld = 2\n'))
        got = [p.split(":")[0] for p in ei.value.problems]
        assert all(any(g.startswith(w) for g in got) for w in wants), ei.value.problems


def test_sweep_options_a_run_would_not_honour_are_refused(tmp_path):
    """A window belongs to [shape] (it was taken as a method option, passed twice at run time
    and dropped by the simulator); the engine trains in no float16; ulysses cannot cache half
    its rows (its saved index tensors are not per row)."""
    text = GOOD.replace('[[methods]]\nname = "burst"\n',
                        '[[methods]]\nname = "burst"\noptions = { window = [8, 0] }\n', 1)
    with pytest.raises(SpecError, match="options.window: not a method option in a sweep"):
        load_spec(_write(tmp_path, text, "win"))
    # a [shape] window goes to every call: a method that cannot take one is refused up front
    shaped = GOOD.replace("[shape]\n", "[shape]\nwindow = [8, 0]\n", 1) + (
        '[[methods]]\nname = "ring_flash_attn"\n')
    with pytest.raises(SpecError, match="ring_flash_attn"):
        load_spec(_write(tmp_path, shaped, "ext"))
    train = ('workload = "train_step"\nmodel = "tiny"\ndtype = "float16"\nseq_lens = [64]\n'
             'world = 2\n[[methods]]\nname = "burst"\n')
    with pytest.raises(SpecError, match="dtype: the engine trains in .*, not float16"):
        load_spec(_write(tmp_path, train, "fp16"))
    uly = train.replace('"float16"', '"float32"').replace('name = "burst"\n', (
        'name = "ulysses"\noptions = { layout = "striped" }\ncheckpointing = '
        '"selective_half"\n'))
    with pytest.raises(SpecError, match="ulysses' also saves tensors that are not rows"):
        load_spec(_write(tmp_path, uly, "uly"))


def test_cell_problems_are_listed_together(tmp_path):
    text = GOOD.replace("[64, 128]", "[64, 100]").replace('[[methods]]\nname = "burst"\n',
                                                          '[[methods]]\nname = "burst"\n'
                                                          'label = "z"\n', 1)
    text = text.replace('baseline = "burst"', 'baseline = "z"')
    text += '[[methods]]\nname = "ulysses"\n'
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, text))
    probs = ei.value.problems
    # 100 tokens cannot be zigzag-split over 4 ranks (8 chunks): one line per method entry
    assert sum("seq_len@world 100@4" in p and "multiple of 8" in p for p in probs) == 2, probs
    assert len(probs) == 2, probs  # ulysses (contiguous, 4 heads over 4 ranks) is fine
    # with skip_invalid the impossible cells are not spec problems (they become skipped rows)
    ok = text.replace('label = "z"\n', 'label = "z"\nskip_invalid = true\n').replace(
        'label = "burst-ring"\n', 'label = "burst-ring"\nskip_invalid = true\n')
    assert len(expand(load_spec(_write(tmp_path, ok)))) == 6


def test_key_cell_and_value_problems_come_in_one_report(tmp_path):
    """A typo, an indivisible length, a repeated length, a bad option value and a block-level
    method: all in the first report (cells are checked even when keys are wrong); an empty
    [[scales]] list is a problem, not a sweep of nothing."""
    text = GOOD.replace("[64, 128]", "[64, 100, 64]").replace("world = 4", "world = 4\nrepeatz = 3")
    text += '[[methods]]\nname = "burst"\nlabel = "typo"\noptions = { backward = "burts" }\n'
    text += '[[methods]]\nname = "tp"\n'
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, text))
    probs = "\n".join(ei.value.problems)
    for part in ("repeatz", "seq_len@world 100@4", "64@4 appears more than once",
                 "unknown backward 'burts'", "'tp' is block-level"):
        assert part in probs, (part, probs)
    empty = "workload = 'attention'\nscales = []\n[shape]\nheads = 4\nhead_dim = 8\n" \
            "[[methods]]\nname = 'burst'\n"
    with pytest.raises(SpecError, match="no scale"):
        load_spec(_write(tmp_path, empty, "empty"))
    # a misspelt key of a scale (one node of 8, every link counted inside it, had it gone)
    typo = empty.replace("scales = []\n", "") + "[[scales]]\nworld = 8\nnode = 2\n"
    with pytest.raises(SpecError, match=r"scales\[0\]\.node: unknown key.*'nodes'"):
        load_spec(_write(tmp_path, typo, "typo"))


def test_cells_and_ids(tmp_path):
    spec = load_spec(_write(tmp_path, GOOD))
    cells = expand(spec)
    assert [(c.seq_len, c.label) for c in cells] == [
        (64, "burst"), (64, "burst-ring"), (128, "burst"), (128, "burst-ring")]
    assert cells[1].options == {"backward": "ring", "ranks_per_node": 4}  # "@node" resolved
    ids = [c.cell_id for c in cells]
    assert len(set(ids)) == len(ids)
    # stable: the same file elsewhere, under another name, with another time limit
    other = load_spec(_write(tmp_path, GOOD.replace('world = 4', 'world = 4\ntimeout_min = 3'),
                             "renamed"))
    assert [c.cell_id for c in expand(other)] == ids
    # a change that changes the measurement changes the id
    more = load_spec(_write(tmp_path, GOOD.replace('world = 4', 'world = 4\nrepeats = 9'),
                            "more"))
    assert not set(c.cell_id for c in expand(more)) & set(ids)
    # cells round-trip through JSON (they travel to ranks and jobs)
    assert [type(c).from_json(c.to_json()) for c in cells] == cells
    # grouped-query heads (no shipped attention spec has them; a reversed check refused them)
    gqa = load_spec(_write(tmp_path, GOOD.replace("heads = 4\n", "heads = 4\nkv_heads = 2\n"),
                           "gqa"))
    assert {(c.heads, c.kv_heads) for c in expand(gqa)} == {(4, 2)}
    # the memory profiler runs on CPU cells only, and is no part of a CUDA cell's id (a CUDA
    # cell profiled would also have a new id: a resumed GPU run would rerun every cell)
    cuda = load_spec(_write(tmp_path, GOOD.replace("world = 4", 'world = 4\ndevice = "cuda"'),
                            "cuda"))
    assert not any(c.profile_memory for c in expand(cuda))
    assert all(c.profile_memory for c in cells)
    unprofiled = load_spec(_write(tmp_path, GOOD.replace(
        "world = 4", 'world = 4\ndevice = "cuda"\nprofile_memory = false'), "unprofiled"))
    assert [c.cell_id for c in expand(cuda)] == [c.cell_id for c in expand(unprofiled)]


def test_shipped_specs_are_valid():
    names = sorted(p.stem for p in SPEC_DIR.glob("*.toml"))
    assert {"smoke", "cpu_scaling", "paper_kernel_32gpu", "paper_main_7b",
            "paper_main_14b"} <= set(names)
    for n in names:
        cells = expand(load_spec(n))
        assert cells and len({c.cell_id for c in cells}) == len(cells), n
    # the paper specs mirror results/paper_reference: same GPU counts and lengths
    k = expand(load_spec("paper_kernel_32gpu"))
    assert {c.world for c in k} == {32} and {c.nodes for c in k} == {4}
    assert sorted({c.seq_len for c in k}) == [131072, 262144, 524288, 1048576]
    m14 = expand(load_spec("paper_main_14b"))
    assert {(c.world, c.seq_len) for c in m14} == {(32, 1 << 20), (64, 1 << 21)}
    assert {c.checkpointing for c in m14} == {"selective", "full"}
    assert {c.model for c in m14} == {"14b"} and {c.dtype for c in m14} == {"bfloat16"}


def test_dry_run_prints_sbatch_and_gpu_hours():
    spec = load_spec("paper_kernel_32gpu")
    buf = io.StringIO()
    slurm = dataclasses.replace(spec.slurm, partition="gpu-a800", account="proj", qos="high",
                                constraint="a800", mem_gb=200)
    hours = dry_run(expand(spec), slurm=slurm, sweep=spec.name, stream=buf)
    out = buf.getvalue()
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --array=0-15%16", "#SBATCH --partition=gpu-a800",
                 "#SBATCH --account=proj", "#SBATCH --qos=high", "#SBATCH --constraint=a800",
                 "#SBATCH --mem=200G", "#SBATCH --time=30", "submitit.core._submit"):
        assert line in out, line
    assert hours == pytest.approx(16 * 32 * 30 / 60)
    assert "at most 256.0 GPU-hours" in out and "nothing was submitted" in out


def test_dry_run_shows_the_per_run_job_folder(tmp_path, capsys):
    """A shared --job-folder gets <sweep>-<run_id>/ per run and slurm-<id>/ per submission
    (executors.submit_cells); the dry run's sbatch lines showed the folder without them."""
    assert cli.main(["run", "paper_kernel_32gpu", "--executor", "dry-run", "--out",
                     str(tmp_path), "--job-folder", "/shared/me/jobs"]) == 0
    want = "#SBATCH --output='/shared/me/jobs/paper_kernel_32gpu-<run_id>/slurm-<id>/%A_%a/"
    assert want in capsys.readouterr().out


def test_dry_run_names_the_cells_that_will_be_skipped_rows(tmp_path, capsys):
    """A skip_invalid method's impossible cell gets no job: the dry run left it out without a
    word, so its total disagreed with `burst-bench list` (found by a CLI audit)."""
    assert cli.main(["run", "paper_main_7b", "--executor", "dry-run", "--out",
                     str(tmp_path)]) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("# not submitted")]
    assert len(skipped) == 1 and "Deepspeed-Ulysses" in skipped[0]
    assert "does not divide 32 query heads" in skipped[0]
    assert "# total: 19 cells" in out and len(expand(load_spec("paper_main_7b"))) == 20


def test_dry_run_of_a_resumed_sweep_counts_only_what_is_left(tmp_path):
    """The GPU-hours a dry run prints are those of the cells the resumed run has not done."""
    from suites.run import _spec_hash, run_sweep

    spec = load_spec("paper_kernel_32gpu")
    run = tmp_path / spec.name / "r1"
    run.mkdir(parents=True)
    store.write_meta(run, {"spec_hash": _spec_hash(spec), "created": "2026-01-01T00:00:00Z"})
    done = [c.cell_id for c in expand(spec)[:4]]
    for i, cid in enumerate(done):
        store.append_row(run / "rows.jsonl", {"cell_id": cid, "status": "ok" if i else "oom"})
    for retry, left in ((False, 12), (True, 13)):  # --retry-failed runs the oom cell again
        buf = io.StringIO()
        run_sweep(spec, executor="dry-run", out=tmp_path, retry_failed=retry, stream=buf)
        assert f"at most {left * 32 * 30 / 60:.1f} GPU-hours" in buf.getvalue(), retry
        # the resumed run's own folder, not a placeholder for a new one
        assert f"{run}/jobs/slurm-<id>/%A_%a/" in buf.getvalue()
    # a dead driver's job for cell 5: collected or waited for by the next run, not priced
    cell5 = expand(spec)[5].cell_id
    store.append_row(run / "jobs.jsonl", {"cell_id": cell5, "job_id": "77_5", "kind": "slurm"})
    buf = io.StringIO()
    run_sweep(spec, executor="dry-run", out=tmp_path, stream=buf)
    assert "1 with jobs of an earlier driver" in buf.getvalue()
    assert f"at most {11 * 32 * 30 / 60:.1f} GPU-hours" in buf.getvalue()


def test_store_atomic_rows_and_torn_tail(tmp_path):
    rows = tmp_path / "rows.jsonl"
    for i in range(3):
        store.append_row(rows, {"cell_id": f"c{i}", "status": "ok", "time_s": 1.0 + i})
    with open(rows, "ab") as f:  # a writer killed mid-line
        f.write(b'{"cell_id": "c3", "sta')
    assert [r["cell_id"] for r in store.read_rows(rows)] == ["c0", "c1", "c2"]
    assert store.repair(rows) > 0 and store.repair(rows) == 0
    store.append_row(rows, {"cell_id": "c3", "status": "ok"})
    assert [r["cell_id"] for r in store.read_rows(rows)] == ["c0", "c1", "c2", "c3"]
    # torn, then given a newline (an editor): read_rows ignores it, so repair must cut it, or
    # the next appended row makes it a middle line and the run unreadable
    with open(rows, "ab") as f:
        f.write(b'{"cell_id": "c4", "sta\n')
    assert store.repair(rows) > 0 and store.repair(rows) == 0
    store.append_row(rows, {"cell_id": "c4", "status": "ok"})
    assert [r["cell_id"] for r in store.read_rows(rows)] == ["c0", "c1", "c2", "c3", "c4"]
    # a whole row without its newline (an editor's save) is read, so it is kept, not cut
    rows.write_bytes(rows.read_bytes()[:-1])
    assert len(store.read_rows(rows)) == 5 and store.repair(rows) == 0
    assert rows.read_bytes().endswith(b"}\n") and len(store.read_rows(rows)) == 5
    # torn inside a multibyte character (or other bytes that are not UTF-8): torn as well (it
    # raised UnicodeDecodeError, naming no file, from show, resume and repair alike)
    with open(rows, "ab") as f:
        f.write(b'{"cell_id": "\xe9')
    assert len(store.read_rows(rows)) == 5 and store.repair(rows) > 0
    assert store.repair(rows) == 0 and len(store.read_rows(rows)) == 5
    rows.write_text(rows.read_text() + "not json\n" + json.dumps({"cell_id": "c4"}) + "\n")
    with pytest.raises(ValueError, match="not a torn write"):
        store.read_rows(rows)


def _rows(label_times, **common):
    out = []
    for i, (label, n, t, status) in enumerate(label_times):
        r = empty_row()
        r.update(cell_id=f"{label}-{n}", label=label, method=label, seq_len=n, world=4,
                 workload="attention", status=status, time_s=t, bytes_sent_forward=10,
                 bytes_sent_backward=20, index=i)
        r.update(common)
        out.append(r)
    return out


def _run_dir(tmp_path, name, rows, baseline="ring"):
    d = tmp_path / "sweep" / name
    d.mkdir(parents=True)
    for r in rows:
        store.append_row(d / store.ROWS, r)
    store.write_meta(d, {"baseline": baseline, "cells": [r["cell_id"] for r in rows]})
    return d


def _run_of_spec(tmp_path):
    """GOOD's spec, its cells and its run folder r1 (run.json written, no rows yet)."""
    from suites import run as runmod

    spec = load_spec(_write(tmp_path, GOOD, "sweep"))
    cells = expand(spec)
    run = tmp_path / "out" / spec.name / "r1"
    run.mkdir(parents=True)
    store.write_meta(run, {"spec_hash": runmod._spec_hash(spec), "baseline": spec.baseline,
                           "cells": [c.cell_id for c in cells]})
    return spec, cells, run


def test_tables_summary_speedup_compare(tmp_path):
    import pandas as pd

    rows = _rows([("ring", 64, 2.0, "ok"), ("burst", 64, 1.0, "ok"), ("ring", 128, 4.0, "ok"),
                  ("burst", 128, None, "oom")])
    d = _run_dir(tmp_path, "20250101T000000Z-1", rows)
    df = store.consolidate(d)
    assert list(df.columns[:len(COLUMNS)]) == list(COLUMNS)
    for f in (d / store.TABLE, d / store.CSV):  # pandas reads the tidy tables directly
        t = pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f)
        assert len(t) == 4 and {"label", "speedup", "time_s"} <= set(t.columns)
    sp = dict(zip(df["cell_id"], df["speedup"], strict=True))
    assert sp["burst-64"] == pytest.approx(2.0) and sp["ring-64"] == pytest.approx(1.0)
    assert pd.isna(sp["burst-128"])
    other = df.copy()  # a run resumed on another partition: no speedup across hardware
    other.loc[other["cell_id"] == "burst-64", "hardware"] = "NVIDIA H100 80GB HBM3"
    assert pd.isna(add_speedup(other, "ring").set_index("cell_id").loc["burst-64", "speedup"])
    s = summary(df, "time_s", baseline="ring")
    assert list(s.columns) == ["seq_len", "ring", "burst"]
    assert s.iloc[0]["burst"] == "1000.0 (2.00x)" and s.iloc[1]["burst"] == "oom"
    # the speedup is time's: another metric with a baseline shows no ratio (a time speedup in
    # a memory column passed a test audit)
    other = summary(df.assign(mem_peak_bytes=2.0 ** 30), "mem_peak_bytes", baseline="ring")
    assert other.iloc[0]["burst"] and "x)" not in other.to_string(), other
    tiny = df.assign(time_s=df["time_s"] * 1e-5)  # simulated microsecond steps are not "0.0"
    assert summary(tiny, "time_s").iloc[0]["burst"] == "0.01"
    # a second run, burst twice as fast at 64
    rows2 = _rows([("ring", 64, 2.0, "ok"), ("burst", 64, 0.5, "ok")])
    d2 = _run_dir(tmp_path, "20250102T000000Z-1", rows2)
    c = compare(store.load(d), store.load(d2), "time_s")
    got = {(r.label, r.seq_len): (r.ratio, r.speedup, r.status_b) for r in c.itertuples()}
    assert got[("burst", 64)] == (pytest.approx(0.5), pytest.approx(2.0), "ok")
    assert got[("ring", 64)] == (pytest.approx(1.0), pytest.approx(1.0), "ok")
    assert got[("ring", 128)][2] == "missing"  # a cell of a that b lacks is a row, not a gap
    assert store.latest_run(tmp_path / "sweep") == d2
    assert add_speedup(df, None)["speedup"].equals(df["speedup"])
    both = pd.concat([store.load(d), store.load(d2)], ignore_index=True)
    with pytest.raises(ValueError, match="rows 0 and 4 are the same cell and label"):
        summary(both, "time_s")  # one would silently stand for the other
    with pytest.raises(ValueError, match=r"compare \(b\)"):
        compare(store.load(d), both, "time_s")
    with pytest.raises(ValueError, match="add_speedup: rows 0 and 4"):
        add_speedup(both, "ring")


def test_compare_says_every_key_it_matches_on_and_which_differ(tmp_path, capsys):
    """A measured CPU run against a simulation of its spec (device cuda) said "no matching
    cells (cells match on workload, shape, length, world and label)": device, the one key they
    differ in, was not among the keys it named."""
    import pandas as pd

    from results.tables import MATCH_KEYS, compare, no_match_reason

    cpu = _run_dir(tmp_path, "20250101T000000Z-1", _rows([("ring", 64, 2.0, "ok")],
                                                          device="cpu"))
    sim = _run_dir(tmp_path, "20250102T000000Z-1",
                   _rows([("ring", 64, 1.0, "ok")], device="cuda", source="simulated"))
    assert cli.main(["compare", str(cpu), str(sim)]) == 1
    out = capsys.readouterr().out
    said = out[out.index("cells match on ") + len("cells match on "):out.index(")")]
    assert said.split(", ") == [*MATCH_KEYS, "checkpointing", "fused_head", "label"]
    assert "differ only in device (device: \"cpu\" in a, \"cuda\" in b)" in out
    # no key whose values the two tables do not share: the keys alone
    a = pd.DataFrame(_rows([("ring", 64, 1.0, "ok"), ("burst", 128, 1.0, "ok")]))
    b = pd.DataFrame(_rows([("ring", 128, 1.0, "ok"), ("burst", 64, 1.0, "ok")]))
    msg = no_match_reason(a, b)
    assert "differ only" not in msg and "cells match on workload" in msg
    # a table of no rows (a header-only CSV) is named, not blamed on the keys
    assert no_match_reason(a, b.iloc[:0], ("cpu", "gpu")) == "no matching cells: gpu has no rows"
    assert no_match_reason(a.iloc[:0], b.iloc[:0]) == "no matching cells: a and b have no rows"
    # a spec edited in its checkpointing keeps its labels: the cells are not the same
    full = b.assign(seq_len=a["seq_len"], checkpointing="full")
    assert compare(a.assign(checkpointing="selective"), full)["status_b"].eq("missing").all()


def test_cli_read_only_commands(tmp_path, capsys, monkeypatch):
    rows = _rows([("ring", 64, 2.0, "ok"), ("burst", 64, 1.0, "ok")])
    d = _run_dir(tmp_path, "20250101T000000Z-1", rows)
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "smoke" in out and "paper_main_14b" in out and "INVALID" not in out
    assert cli.main(["show", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "speedup vs ring" in out and "1000.0 (2.00x)" in out
    # another baseline than the run's: the speedups follow it (they stayed the run's)
    assert cli.main(["show", str(d), "--baseline", "burst", "--metric", "time_s"]) == 0
    out = capsys.readouterr().out
    assert "speedup vs burst" in out and "2000.0 (0.50x)  1000.0 (1.00x)" in out
    assert cli.main(["compare", str(d), str(d), "--out", str(tmp_path / "c.csv")]) == 0
    assert "speedup" in capsys.readouterr().out and (tmp_path / "c.csv").exists()
    # the same labels in another dtype are other cells: nothing to compare
    fp32 = _run_dir(tmp_path, "fp32", _rows([("ring", 64, 2.0, "ok")], dtype="float32"))
    bf16 = _run_dir(tmp_path, "bf16", _rows([("ring", 64, 1.0, "ok")], dtype="bfloat16"))
    assert cli.main(["compare", str(fp32), str(bf16)]) == 1
    assert "the cells differ only in dtype" in capsys.readouterr().out
    assert cli.main(["run", "paper_main_7b", "--executor", "dry-run", "--partition", "p1",
                     "--time", "45", "--account", "a1", "--qos", "q1", "--constraint", "c1"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --partition=p1" in out and "#SBATCH --time=45" in out
    assert all(f"#SBATCH --{k}={v}1" in out for k, v in (("account", "a"), ("qos", "q"),
                                                           ("constraint", "c")))
    assert "#SBATCH --nodes=8" in out and "GPU-hours" in out
    assert "note:" not in capsys.readouterr().err
    # on the inline and local executors the SLURM flags do nothing: said, not silently dropped
    from suites import run as runmod

    ran = []
    monkeypatch.setattr(runmod, "run_sweep", lambda *a, **k: ran.append(k) or
                        runmod.RunResult(None, None, 0))
    assert cli.main(["run", "smoke", "--executor", "local", "--time", "45", "--qos", "q"]) == 0
    assert [k["executor"] for k in ran] == ["local"] and "note: --time, --qos apply to SLURM " \
        "jobs only; the local executor ignores them" in capsys.readouterr().err
    assert ran[0]["retry_failed"] is False
    assert cli.main(["run", "smoke", "--executor", "local", "--retry-failed"]) == 0
    assert ran[1]["retry_failed"] is True
    with pytest.raises(SystemExit):  # SLURM would read --time=0 as no limit at all
        cli.main(["run", "paper_main_7b", "--executor", "dry-run", "--time", "2"])
    assert "give whole minutes >= 3" in capsys.readouterr().err
    assert cli.main(["run", str(tmp_path / "missing.toml")]) == 2
    assert "no spec file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:  # a misspelt option: the subcommand's usage, which
        cli.main(["run", "smoke", "--executr", "local"])  # lists its options (was the top one)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "usage: burst-bench run" in err and "--executor" in err
    assert "unrecognized arguments: --executr local" in err
    # the simulator gets the arguments
    with pytest.raises(SystemExit) as ei:
        cli.main(["simulate", "--help"])
    assert ei.value.code == 0 and "simulate" in capsys.readouterr().out


def _binary(path: Path) -> Path:
    path.write_bytes(b"\xff\xfe\x00name")
    return path


def test_cli_user_errors_are_messages_not_tracebacks(tmp_path, capsys, monkeypatch):
    """Each was a traceback (or a silent wrong answer) before (found by a harness audit)."""
    rows = _rows([("ring", 64, 2.0, "ok"), ("burst", 64, 1.0, "ok")])
    d = _run_dir(tmp_path, "20250101T000000Z-1", rows)
    newer = tmp_path / "sweep" / "20250102T000000Z-1"  # a newer run, on its first cell
    newer.mkdir()
    store.write_meta(newer, {"baseline": "ring", "created": "2999-01-01T00:00:00Z"})
    assert store.latest_run(tmp_path / "sweep") == newer
    assert cli.main(["show", str(tmp_path / "sweep")]) == 0  # the latest run with rows
    assert "1000.0 (2.00x)" in capsys.readouterr().out
    for argv, msg in (
            (["show", str(d), "--metric", "nosuch"], "--metric: unknown 'nosuch'"),
            (["show", str(d), "--raw", "--columns", "label,nosuch"], "no column 'nosuch'"),
            (["show", str(d), "--baseline", "nosuch"], "not a label of these rows"),
            (["compare", str(d), str(d), "--fail-above", "nan"], "give a percentage >= 0"),
            (["compare", str(d), str(d), "--metric", "nosuch"], "--metric: unknown"),
            (["compare", str(d), str(d), "--names", "x"], "give two different names"),
            (["compare", str(d), str(d), "--names", "a,b,c"], "give two different names"),
            (["run", str(tmp_path), "--executor", "dry-run"], "is a folder, not a spec file"),
            (["run", str(_write(tmp_path, GOOD_TINY)), "--executor", "dry-run", "--out",
              str(tmp_path / "o"), "--run-id", "../escaped"], "a run id is one folder"),
            (["run", str(_write(tmp_path, GOOD_TINY)), "--executor", "dry-run", "--out",
              str(tmp_path / "o"), "--run-id", str(tmp_path / "abs")], "a run id is one folder"),
            # flags that were silently ignored, and an --out of the wrong kind (a file error
            # after the work, or a traceback)
            (["show", str(d), "--columns", "label"], "--columns picks the columns of --raw"),
            (["list", "--dir", str(d)], "no spec file (*.toml) in it"),
            (["show", str(d), "--raw", "--metric", "time_s"], "--metric shapes the summary"),
            (["compare", str(d), str(d), "--out", str(tmp_path)], "is a folder; give the path"),
            (["run", str(_write(tmp_path, GOOD_TINY)), "--new", "--retry-failed"],
             "a --new run has none"),
            (["run", str(_write(tmp_path, GOOD_TINY)), "--out", str(d / "rows.jsonl")],
             "is a file, not a folder"),
            # a CLI fuzz: a file where the sweep folder goes said "rows written before it are
            # kept and a rerun resumes", and so did the dry run, which writes no rows
            (["run", str(_write(tmp_path, GOOD_TINY)), "--out", str(_file_as(tmp_path / "fo"))],
             "cannot write the sweep folder"),
            (["run", str(_write(tmp_path, GOOD_TINY)), "--executor", "dry-run", "--out",
              str(_file_as(tmp_path / "fo"))], "cannot write the sweep folder"),
            (["run", str(_binary(tmp_path / "bin.toml")), "--executor", "dry-run"],
             "bin.toml: 1 problem:\n  - not UTF-8 text"),
            # found by a CLI audit: a CSV into a missing folder failed after the comparison
            # (exit 1, pandas' message); a file as --job-folder failed inside submitit; a
            # file as --dir was "no such folder"
            (["compare", str(d), str(d), "--out", str(tmp_path / "nodir" / "c.csv")],
             "no folder"),
            (["run", str(_write(tmp_path, GOOD_TINY)), "--executor", "dry-run",
              "--job-folder", str(d / "rows.jsonl")], "--job-folder"),
            (["list", "--dir", str(d / "rows.jsonl")], "a file, not a folder")):
        assert cli.main(argv) == 2, argv
        assert msg in capsys.readouterr().err, argv
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "abs").exists()
    # a run's own table file shows the spec's speedups, as its folder does
    assert cli.main(["show", str(d / "rows.jsonl")]) == 0
    assert "1000.0 (2.00x)" in capsys.readouterr().out
    # --new with the id of an existing run would resume it: refused
    first = tmp_path / "o2"
    spec = str(_write(tmp_path, GOOD_TINY))
    (first / "sweep" / "kept").mkdir(parents=True)
    assert cli.main(["run", spec, "--executor", "dry-run", "--out", str(first), "--run-id",
                     "kept", "--new"]) == 2
    assert "--new with --run-id 'kept'" in capsys.readouterr().err
    # an import path that cannot be a method is refused when the spec is read
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, GOOD_TINY.replace('name = "ring"', 'name = "os:getcwd"'),
                         "notamethod"))
    assert any("takes 0 positional parameters, not q, k, v" in p for p in ei.value.problems)
    # and one without a keyword every call passes (it failed on every rank after the spawn,
    # with torch's TypeError); **kwargs takes them all
    (tmp_path / "nogroup.py").write_text(
        "import torch\n"
        "def f(q, k, v, *, causal, softmax_scale=None):\n    return q\n"
        "def g(q, k, v, **kw):\n    return q\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, q, k, v, causal=False):\n        return q\n"
        "m = M()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, GOOD_TINY.replace('name = "ring"', 'name = "nogroup:f"'),
                         "nogroup"))
    assert any("method 'nogroup:f' does not take the keyword argument group, which every call "
               "passes: a method is called as method(q, k, v, *, causal, softmax_scale, group, "
               "**options)" in p for p in ei.value.problems), ei.value.problems
    assert load_spec(_write(tmp_path, GOOD_TINY.replace('name = "ring"', 'name = "nogroup:g"'),
                            "nogroup_kw"))
    with pytest.raises(SpecError) as ei:  # a torch module: its forward's signature
        load_spec(_write(tmp_path, GOOD_TINY.replace('name = "ring"', 'name = "nogroup:m"'),
                         "nogroup_module"))
    assert any("'nogroup:m' does not take the keyword arguments softmax_scale, group" in p
               for p in ei.value.problems), ei.value.problems
    # so is a module that fails as it imports, whatever it raises (a SyntaxError, a missing
    # shared library's OSError, its own error): not a traceback, nor a run that "failed"
    for mod, body, why in (("fails_syntax", "def f(:\n", "SyntaxError"),
                           ("fails_oserror", "raise OSError('libfoo.so: no such file')\n",
                            "OSError: libfoo.so"),
                           ("fails_runtime", "raise RuntimeError('boom')\n", "RuntimeError: boom")):
        (tmp_path / f"{mod}.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        with pytest.raises(SpecError) as ei:
            load_spec(_write(tmp_path, GOOD_TINY.replace('name = "ring"', f'name = "{mod}:f"'),
                             mod))
        assert any(f"cannot import method '{mod}:f': {why}" in p for p in ei.value.problems), \
            ei.value.problems
    # a CSV that is not a table of rows (another file, compare's output, the published
    # numbers) is named so by show and compare (it was a KeyError's traceback, or a table of
    # dashes and exit 0)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    for argv in (["show", str(tmp_path / "other.csv")],
                 ["compare", str(tmp_path / "other.csv"), str(tmp_path / "other.csv")]):
        assert cli.main(argv) == 2
        assert "other.csv is not a table of result rows (no column 'label', 'status'" in \
            capsys.readouterr().err
    # a CSV pandas cannot parse, or a word in a number column, named with its file (and
    # column): it was pandas' message alone (a CLI fuzz)
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "word.csv").write_text("label,status,seq_len,world,time_s\nring,ok,64,2,fast\n")
    for name, says in (("empty.csv", "empty.csv: not a readable csv table (No columns"),
                       ("word.csv", "word.csv: column 'time_s' holds 'fast' (row 1), not a "
                                    "number")):
        assert cli.main(["show", str(tmp_path / name)]) == 2
        assert says in capsys.readouterr().err
    # so are a run folder's hand-edited rows: a number written as a string (pandas' "'<' not
    # supported between 'str' and 'int'" traceback in show) and a negative time (a -104x
    # speedup), in the folder, its rows file and a copy of that file
    row = {"cell_id": "a", "label": "ring", "status": "ok", "seq_len": 64, "world": 2,
           "time_s": 0.5}
    # (named by its cell: a run's rows come out one per cell, sorted, not as the file has them)
    for i, (edit, says) in enumerate((
            (dict(seq_len="64"), "column 'seq_len' holds '64' (cell b, label 'ring')"),
            (dict(time_s=-0.5), "column 'time_s' holds -0.5 (cell b, label 'ring')"))):
        run = tmp_path / f"edited{i}" / "r1"
        run.mkdir(parents=True)
        store.append_row(run / store.ROWS, row)
        store.append_row(run / store.ROWS, {**row, "cell_id": "b", **edit})
        (tmp_path / f"edited{i}.jsonl").write_bytes((run / store.ROWS).read_bytes())
        for path in (run.parent, run, run / store.ROWS, tmp_path / f"edited{i}.jsonl"):
            assert cli.main(["show", str(path)]) == 2
            assert says in capsys.readouterr().err, path
    (tmp_path / "specs").mkdir()
    _write(tmp_path / "specs", GOOD_TINY.replace("world = 2", "world = 0"), "broken")
    assert cli.main(["list", "--dir", str(tmp_path / "specs")]) == 0  # `run` finds it by path
    assert f"run {tmp_path / 'specs' / 'broken.toml'} --executor dry-run" in capsys.readouterr().out
    held = tmp_path / "o" / "sweep" / "r1"
    held.mkdir(parents=True)
    with store.RunLock(held):  # another driver writes this run
        assert cli.main(["run", str(_write(tmp_path, GOOD_TINY)), "--out", str(tmp_path / "o"),
                         "--run-id", "r1"]) == 1
    assert "being written by another running sweep" in capsys.readouterr().err
    for text, want in (
            (GOOD_TINY.replace("heads = 2", "heads = 0"), "shape.heads: 0 must be >= 1"),
            (GOOD_TINY.replace("[shape]\nheads = 2\nhead_dim = 8", 'shape = "big"'),
             "shape: 'big' is of type str"),
            ("seed = 99999999999999999999\n" + GOOD_TINY, "seed: 99999999999999999999 must be"),
            (GOOD_TINY.replace("world = 2", "world = 0"), "world: 0 must be >= 1"),
            (GOOD_TINY + 'label = " "\n', "label: ' ' is empty"),
            (GOOD_TINY + '[[methods]]\nname = "ring"\n', "label 'ring' is used by 2")):
        with pytest.raises(SpecError) as ei:
            load_spec(_write(tmp_path, text, "bad"))
        assert any(want in p for p in ei.value.problems), (want, ei.value.problems)
        assert len(ei.value.problems) == 1, ei.value.problems  # once, no follow-on noise


def test_a_row_says_what_its_cell_was(tmp_path):
    """Every column taken from the cell holds that cell's value (none checked before: warmup
    and repeats swapped went unseen)."""
    from suites.rows import RunContext, make_row

    text = GOOD.replace("world = 4", "world = 4\nnodes = 2\nwarmup = 2\nrepeats = 5\n"
                        'dtype = "bfloat16"')
    cell = expand(load_spec(_write(tmp_path, text)))[1]
    row = make_row(cell, {}, RunContext("r", "inline", "{}", None, None), host={})
    for column in ("sweep", "cell_id", "workload", "method", "label", "seq_len", "batch",
                   "heads", "kv_heads", "head_dim", "causal", "dtype", "world", "nodes",
                   "ranks_per_node", "device", "warmup", "repeats"):
        assert row[column] == getattr(cell, column), column
    assert (row["warmup"], row["repeats"], row["nodes"], row["ranks_per_node"]) == (2, 5, 2, 2)
    assert json.loads(row["method_options"]) == cell.options and row["source"] == "measured"


def test_classify_and_schema_readme():
    assert classify("torch.OutOfMemoryError: CUDA out of memory. Tried") == "oom"
    assert classify("spawned ranks did not finish within 60 s") == "timeout"
    assert classify("Job not requeued because: timed-out and not checkpointable.") == "timeout"
    assert classify("RuntimeError: boom") == "error"
    # a rank out of memory whose peers then time out in a collective: the cause, not its echo
    assert classify("rank 1 raised torch.OutOfMemoryError: CUDA out of memory\nrank 0 raised "
                    "RuntimeError: [gloo] Connection timed out waiting for rank 1") == "oom"
    readme = (SPEC_DIR.parent.parent / "results" / "README.md").read_text()
    assert markdown_table() in readme, "regenerate: python -m results.readme"
    from results.readme import BEGIN, END, with_table
    assert with_table(readme) == readme
    table = f"{BEGIN}\n{markdown_table()}\n{END}"
    assert with_table(f"a\n{BEGIN}\nold\n{END}\nb\n") == f"a\n{table}\nb\n"
    for broken in (f"a\n{BEGIN}\nold\nb\n", f"a\nold\n{END}\nb\n", f"{END}\n{BEGIN}\n",
                   f"{BEGIN}{END}{BEGIN}{END}"):  # text after the table was dropped, or doubled
        with pytest.raises(ValueError, match="once each, in that order"):
            with_table(broken)
    assert SlurmSpec().time_min > 0
    from suites.measure import peak_tflops  # MFU's peak: the PCIe/NVL H100s are not the SXM
    assert [peak_tflops(f"NVIDIA {n}") for n in ("H100 PCIe", "H100 NVL", "H100 80GB HBM3",
                                                  "H200 NVL", "H800 PCIe", "A100-SXM4-80GB",
                                                  "GeForce RTX 4090")] == [
        756.0, 835.0, 989.0, 835.0, 756.0, 312.0, None]


def test_resume_finds_its_own_spec_by_time_not_by_name(tmp_path):
    """The newest run of this very spec is resumed even after a run of another spec; runs sort
    by their creation time, so a named run ("before") is not newest by its name; two new runs
    in one second get two folders."""
    from suites.run import _spec_hash, select_run

    a = load_spec(_write(tmp_path, GOOD, "sweep"))
    b = dataclasses.replace(a, seed=a.seed + 1)
    out = tmp_path / "out"
    runs = {}
    for name, spec, created in (("before", b, "2026-01-01T00:00:00Z"),
                                ("20260102T000000Z-1", a, "2026-01-02T00:00:00Z"),
                                ("20260103T000000Z-1", b, "2026-01-03T00:00:00Z")):
        runs[name] = out / a.name / name
        runs[name].mkdir(parents=True)
        store.write_meta(runs[name], {"spec_hash": _spec_hash(spec), "created": created})
    assert store.latest_run(out / a.name) == runs["20260103T000000Z-1"]
    assert select_run(a, out) == runs["20260102T000000Z-1"]
    assert select_run(b, out) == runs["20260103T000000Z-1"]
    first = select_run(a, out, new=True)
    first.mkdir()
    assert select_run(a, out, new=True) != first


def test_resume_key_is_what_a_run_measures(tmp_path):
    """A spec changed only in where or how long it runs resumes its run (raising a time limit
    and --retry-failed re-ran the whole sweep); one that measures something else does not, and
    naming a run that holds another spec's cells is refused (its rows would mix)."""
    from suites.run import _spec_hash, select_run

    a = load_spec(_write(tmp_path, GOOD, "sweep"))
    same = dataclasses.replace(a, timeout_min=a.timeout_min * 3, description="longer",
                               baseline=None, slurm=dataclasses.replace(a.slurm, time_min=999))
    assert _spec_hash(same) == _spec_hash(a)
    for other in (dataclasses.replace(a, seed=a.seed + 1), dataclasses.replace(a, repeats=9)):
        assert _spec_hash(other) != _spec_hash(a)
    out = tmp_path / "out"
    run = out / a.name / "r1"
    run.mkdir(parents=True)
    store.write_meta(run, {"spec_hash": _spec_hash(a), "created": "2026-01-01T00:00:00Z"})
    assert select_run(same, out) == run == select_run(same, out, run_id="r1")
    with pytest.raises(ValueError, match="holds another spec's cells"):
        select_run(dataclasses.replace(a, repeats=9), out, run_id="r1")
    # a run recorded under an older hash is still this spec's if it lists the same cells; the
    # same spec JSON with other cell ids (a code change renamed them) is another run: resuming
    # it measured every cell again into it, and the table then mixed or failed
    ids = [c.cell_id for c in expand(a)]
    old = out / a.name / "r0"
    old.mkdir()
    store.write_meta(old, {"spec_hash": "0123456789abcdef", "spec": a.to_json(),
                           "cells": ids, "created": "2026-01-02T00:00:00Z"})
    assert select_run(a, out) == old == select_run(a, out, run_id="r0")
    for cells in (["old" + i for i in ids], ids + ["extra"]):  # renamed; or a wider spec's
        store.write_meta(old, {"spec_hash": "0123456789abcdef", "spec": a.to_json(),
                               "cells": cells, "created": "2026-01-02T00:00:00Z"})
        assert select_run(a, out) == run
        with pytest.raises(ValueError, match="holds another spec's cells"):
            select_run(a, out, run_id="r0")


def test_provenance_without_git_takes_the_commit_it_is_given(tmp_path, monkeypatch):
    """A copy of the tree without .git (a lent GPU machine) records the commit whoever copied
    it passes in BURST_GIT_COMMIT, not nothing."""
    from suites import provenance

    monkeypatch.setattr(provenance, "_git", lambda *a: None)
    monkeypatch.setenv("BURST_GIT_COMMIT", "abc123")
    assert provenance.code_provenance() == {"git_commit": "abc123", "git_dirty": None}
    monkeypatch.delenv("BURST_GIT_COMMIT")
    assert provenance.code_provenance()["git_commit"] is None


def test_a_given_commit_wins_over_a_stale_git(monkeypatch):
    """A lent machine's copy carried the .git of the session's first commit: the commit that
    ran, passed in BURST_GIT_COMMIT, is recorded instead of that HEAD (dirtiness unknown)."""
    from suites import provenance

    monkeypatch.setattr(provenance, "_git", lambda *a: "stale" if a[0] == "rev-parse" else " M x")
    monkeypatch.setenv("BURST_GIT_COMMIT", "abc123")
    assert provenance.code_provenance() == {"git_commit": "abc123", "git_dirty": None}
    monkeypatch.delenv("BURST_GIT_COMMIT")
    assert provenance.code_provenance() == {"git_commit": "stale", "git_dirty": True}


def test_rewritten_results_do_not_make_the_code_dirty(tmp_path, monkeypatch):
    """Simulating several sweeps in one command rewrites committed tables: the later sweeps'
    rows must still say the code was clean; a changed source file must not."""
    import subprocess

    from suites import provenance

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "paper_figures" / "out").mkdir(parents=True)
    for f in ("code.py", "results/table.csv", "paper_figures/out/fig.csv"):
        (tmp_path / f).write_text("a\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    (tmp_path / "results" / "table.csv").write_text("b\n")
    (tmp_path / "paper_figures" / "out" / "fig.csv").write_text("b\n")  # a redrawn figure
    (tmp_path / "results" / "sweep" / "run1").mkdir(parents=True)
    (tmp_path / "results" / "sweep" / "run1" / "rows.jsonl").write_text("{}\n")  # untracked
    assert provenance.code_provenance()["git_dirty"] is False
    for change in ("code.py", "results/tables.py", "new_method.py"):  # edited, new, new
        (tmp_path / change).write_text("b\n")
        assert provenance.code_provenance()["git_dirty"] is True, change
        git("checkout", "-q", "--", ".")
        git("clean", "-qfx", "--", "code.py", "results/tables.py", "new_method.py")
    assert provenance.code_provenance()["git_dirty"] is False
    # a run's --out inside the checkout but not under results/ is data for that run
    (tmp_path / "my_runs" / "sweep" / "run1").mkdir(parents=True)
    (tmp_path / "my_runs" / "sweep" / "run1" / "rows.jsonl").write_text("{}\n")
    assert provenance.code_provenance()["git_dirty"] is True
    assert provenance.code_provenance(tmp_path / "my_runs")["git_dirty"] is False
    assert provenance.code_provenance("/elsewhere")["git_dirty"] is True


def test_resume_skips_by_each_cells_last_row():
    """A resumed run skips the cells done; with --retry-failed it runs again those whose last
    row failed or was skipped (a retried oom that succeeded is done)."""
    from suites.run import _done

    rows = [{"cell_id": "a", "status": "skipped"}, {"cell_id": "b", "status": "oom"},
            {"cell_id": "b", "status": "ok"}, {"cell_id": "c", "status": "ok"},
            {"cell_id": "d", "status": "ok"}, {"cell_id": "d", "status": "error"}]
    assert _done(rows, retry_failed=False) == {"a", "b", "c", "d"}
    assert _done(rows, retry_failed=True) == {"b", "c"}



def test_job_id_names_the_array_task(monkeypatch):
    from suites import provenance

    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID",
              "SUBMITIT_LOCAL_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    assert provenance.job_id() is None
    monkeypatch.setenv("SLURM_JOB_ID", "104")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "100")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert provenance.job_id() == "100_3"  # sacct's name of the task, not its own job id
    # a local job inside a SLURM allocation is that local job (its rows named the
    # allocation, which the driver's job record does not: an executor audit)
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "7")
    assert provenance.job_id() == "7"


def test_local_executor_runs_every_rank_of_a_multinode_cell(tmp_path):
    """The local executor puts all ranks of a cell on this machine (nodes only label links):
    a world-4 cell over 2 'nodes' needs 4 tasks, or its group waits for ever."""
    from suites.executors import _executor
    from suites.simulate import as_cell
    from suites.spec import SlurmSpec

    cell = as_cell(dict(method="ring", seq_len=64, world=4, nodes=2, heads=2, head_dim=8,
                        device="cpu", dtype="float32"))
    ex = _executor("local", tmp_path, [cell], SlurmSpec(), "t")
    assert ex._executor.parameters["tasks_per_node"] == 4
    assert ex._executor.parameters["nodes"] == 1


def test_timegate_threshold_and_check(monkeypatch, tmp_path):
    """threshold = median * (1 + max(3 * spread, 5%)); check fails above it, passes below."""
    from suites import timegate

    ratios = iter([1.0, 1.01, 1.0])
    monkeypatch.setattr(timegate, "GATES", {"g": lambda: (None, None)})
    monkeypatch.setattr(timegate, "STORE", tmp_path / "gates.json")
    monkeypatch.setattr(timegate, "measure_ratio", lambda a, b, repeats=7: next(ratios))
    out = timegate.record(trials=3)
    assert out["g"]["threshold"] == pytest.approx(1.0 * (1 + max(3 * 0.01, 0.05)))
    for r, code in ((1.06, 1), (1.04, 0)):
        monkeypatch.setattr(timegate, "measure_ratio", lambda a, b, repeats=7, r=r: r)
        assert timegate.check() == code
    # a spread above the floor's: 3 x spread sets it (the case above never reached that term)
    ratios = iter([1.0, 1.1, 1.0, 1.0, 0.99])  # median 1.0, spread (1.1 - 0.99) / 1.0
    monkeypatch.setattr(timegate, "measure_ratio", lambda a, b, repeats=7: next(ratios))
    out = timegate.record(trials=5)
    assert out["g"]["threshold"] == pytest.approx(1.0 * (1 + 3 * 0.11))
    # a gate added after the baseline was recorded: a message and exit 2 (was a KeyError)
    monkeypatch.setattr(timegate, "GATES", {"g": lambda: (None, None), "new": lambda: (0, 0)})
    assert timegate.check() == 2


def test_timegate_machine_class_names_the_cpu_model(monkeypatch, tmp_path, capsys):
    """Two x86-64 CPUs shared one class, whose baseline did not fit the other (a ring gate read
    1.35 on one, 1.20-1.28 on the other: a docs audit): the class names the CPU model, and a
    class without a baseline exits 2, naming the recorded ones."""
    from suites import timegate

    monkeypatch.setattr(timegate.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(timegate, "cpu_model", lambda: "Intel(R) Xeon(R) Processor")
    monkeypatch.setattr(timegate.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(timegate.torch, "get_num_threads", lambda: 1)
    assert timegate.machine_class() == "cpu-x86_64-1t-Intel_R_Xeon_R_Processor"
    monkeypatch.setattr(timegate, "STORE", tmp_path / "gates.json")
    (tmp_path / "gates.json").write_text('{"cpu-x86_64-1t-Intel_R_Xeon_R_Processor": {}}')
    monkeypatch.setattr(timegate.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(timegate, "cpu_model", lambda: "AMD EPYC")
    assert timegate.check() == 2
    assert ("no recorded baseline for machine class 'cpu-x86_64-1t-AMD_EPYC' in "
            f"{tmp_path / 'gates.json'} (recorded: cpu-x86_64-1t-Intel_R_Xeon_R_Processor)"
            ) in capsys.readouterr().out
    monkeypatch.setattr(timegate, "cpu_model", lambda: "")
    assert timegate.machine_class() == "cpu-x86_64-1t"
    # on a GPU machine the gates still time CPU code: the CPU's class follows the GPU's name
    monkeypatch.setattr(timegate.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(timegate.torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB")
    assert timegate.machine_class() == "NVIDIA_H100_80GB-cpu-x86_64-1t"


def test_option_placeholders_resolve_per_scale(tmp_path):
    """"@world/K" is world // K on each scale (InternEvo's inner ring of cp/4); one that forms
    no group is a cell the method refuses; an unknown placeholder is a spec problem."""
    text = GOOD_TINY.replace("world = 2", "world = 8").replace(
        'name = "ring"', 'name = "double_ring"\noptions = { ranks_per_node = "@world/4" }')
    (cell,) = expand(load_spec(_write(tmp_path, text)))
    assert cell.options["ranks_per_node"] == 2
    small = text.replace("world = 8", "world = 2")
    with pytest.raises(SpecError, match="ranks_per_node=0"):
        load_spec(_write(tmp_path, small, "small"))
    for bad in ("@world/0", "@nodes", "@world/x"):
        with pytest.raises(SpecError, match="not a known placeholder"):
            load_spec(_write(tmp_path, text.replace("@world/4", bad), "bad"))
    # double_ring without ranks_per_node: a node's ranks, its inner ring (the registry's
    # default, 2, was taken: an inner ring of 2 GPUs on nodes of 8); ring takes none
    text = GOOD_TINY.replace("world = 2", "[[scales]]\nnodes = 2\ngpus_per_node = 4") + \
        '[[methods]]\nname = "double_ring"\n'
    ring, double = expand(load_spec(_write(tmp_path, text, "nodes")))
    assert ring.options == {} and double.options == {"ranks_per_node": 4}, (ring, double)


def test_a_broken_run_file_is_named_and_does_not_block_the_sweep(tmp_path, capsys):
    """One empty or torn run.json blocked run, dry-run and show of the whole sweep folder
    with "Expecting value: line 1 column 1" (no file named); a foreign line in rows.jsonl was
    a raw TypeError / KeyError."""
    good = _run_dir(tmp_path, "20250101T000000Z-1", _rows([("ring", 64, 2.0, "ok")]))
    bad = tmp_path / "sweep" / "crashed"
    bad.mkdir()
    (bad / store.META).write_text("")
    with pytest.raises(ValueError, match=r"crashed/run.json: not a run's metadata"):
        store.read_meta(bad)
    assert store.runs_by_time(tmp_path / "sweep") == [good]
    assert "skipped run crashed" in capsys.readouterr().err
    assert store.runs_by_time(tmp_path / "sweep") == [good]  # said once (run asks twice)
    assert "skipped run" not in capsys.readouterr().err
    assert cli.main(["show", str(tmp_path / "sweep")]) == 0
    with open(good / store.ROWS, "a") as f:
        f.write('{"note": "hand-added"}\n{"cell_id": "x", "status": "ok"}\n')
    with pytest.raises(ValueError, match="line 2 is not a record of this file"):
        store.read_rows(good / store.ROWS)
    assert cli.main(["show", str(good)]) == 2
    assert "line 2 is not a record" in capsys.readouterr().err


def test_a_run_refused_before_its_folder_leaves_no_folder(tmp_path):
    """A review found the sweep-level lock left ``<out>/<sweep>/.lock`` (and the folders above
    it) behind for a run refused before it made its folder, where nothing was left before."""
    from suites.run import run_sweep

    out = tmp_path / "new" / "out"
    with pytest.raises(ValueError, match="a run id is one folder"):
        run_sweep(_write(tmp_path, GOOD_TINY), out=out, run_id="../escaped", stream=io.StringIO())
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.toml"]


def test_a_progress_line_says_where_it_cut_a_reason():
    """A skipped cell's progress line cut its reason mid-list ("valid degrees: 1, 2,") and
    read as whole; it now cuts at a word and ends with "..."."""
    from suites.run import short_reason

    why = "method 'ulysses' cannot run this case: " + "x" * 60 + " valid degrees: 1, 2, 4"
    assert short_reason("Traceback ...\n" + why) == "method 'ulysses' cannot run this case: " \
        + "x" * 60 + " valid degrees: ..."
    assert len(short_reason(why)) <= 120 and short_reason("short\n") == "short"


def test_compare_notes_cells_run_with_other_options_under_one_label(tmp_path, capsys):
    """A label given by hand matches a cell whatever its method options, warmup or repeats:
    a 2 s method against the same label at 4 s read as a 2x regression without a word. The
    comparison still pairs them (the label is the user's), and says how they differ."""
    a = _run_dir(tmp_path / "a", "r1", _rows([("slow", 64, 2.0, "ok"), ("ring", 64, 1.0, "ok")],
                                             method_options='{"delay": 2.0}', repeats=2))
    rows = _rows([("slow", 64, 4.0, "ok"), ("ring", 64, 1.0, "ok")], repeats=2)
    rows[0]["method_options"] = '{"delay": 4.0}'
    rows[1]["method_options"] = '{"delay": 2.0}'
    b = _run_dir(tmp_path / "b", "r1", rows)
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert ("note: 1 matched cell(s) were run differently in a and b: slow 64 (method_options); "
            "their ratio is not the code's alone") in out, out
    same = _run_dir(tmp_path / "c", "r1", _rows([("slow", 64, 2.0, "ok")], repeats=2))
    assert cli.main(["compare", str(same), str(same)]) == 0
    assert "run differently" not in capsys.readouterr().out
    # a training step under another DP wrapper (`run --data-parallel`, kept in the row's
    # cell spec; none there is the engine's ddp) matched without a word (a harness audit)
    trained = {}
    for name, dp in (("ddp", None), ("ddp2", "ddp"), ("world", "fsdp_world")):
        spec = {"method": "ring"} | ({"data_parallel": dp} if dp else {})
        trained[name] = _run_dir(tmp_path / name, "r1", _rows(
            [("ring", 64, 1.0, "ok")], workload="train_step", model="tiny",
            spec=json.dumps(spec)))
    assert cli.main(["compare", str(trained["ddp"]), str(trained["world"])]) == 0
    assert "ring 64 (data_parallel)" in capsys.readouterr().out
    assert cli.main(["compare", str(trained["ddp"]), str(trained["ddp2"])]) == 0
    assert "run differently" not in capsys.readouterr().out
    # two models a spec defines under one name (a review: matched as the same cell, silently)
    for name, layers in (("two", 2), ("eight", 8), ("eight2", 8)):
        own = dataclasses.asdict(dataclasses.replace(get_config("tiny"), num_layers=layers))
        trained[name] = _run_dir(tmp_path / name, "r1", _rows(
            [("ring", 64, 1.0, "ok")], workload="train_step", model="m",
            spec=json.dumps({"method": "ring", "model_config": own})))
    assert cli.main(["compare", str(trained["two"]), str(trained["eight"])]) == 0
    assert "ring 64 (model_config)" in capsys.readouterr().out
    assert cli.main(["compare", str(trained["eight"]), str(trained["eight2"])]) == 0
    assert "run differently" not in capsys.readouterr().out


def test_show_says_which_cells_of_an_interrupted_run_have_no_row(tmp_path, capsys,
                                                                   monkeypatch):
    """A run stopped by SIGTERM showed a clean table of the cells it reached, exit 0; it now
    names the cells without a row, with --raw too (which said nothing), and the command that
    resumes it works from the folder it is printed in (the spec's path was the repository's
    while --out was the current folder's)."""
    d = _run_dir(tmp_path, "20250101T000000Z-1", _rows([("ring", 64, 2.0, "ok")]))
    store.write_meta(d, {"baseline": "ring", "cells": ["ring-64", "burst-64", "ring-128"],
                         "source": "my/spec.toml"})
    for raw in ([], ["--raw"]):
        assert cli.main(["show", str(d), *raw]) == 0
        # the command that resumes it, spelt out: the results folder is the one above the
        # sweep's (it said `--out <its folder>`, which read as the run folder and nested a
        # second run)
        assert ("2 of 3 cells of run 20250101T000000Z-1 have no row (interrupted, or still "
                f"running): burst-64, ring-128; `burst-bench run my/spec.toml --out {tmp_path} "
                "--run-id 20250101T000000Z-1` resumes it") in capsys.readouterr().out, raw
    monkeypatch.chdir(tmp_path)
    # a shipped spec by its name; another spec of the repository relative to here
    for source, shown in (("suites/specs/smoke.toml", "smoke"),
                          ("tests/harness_methods.py", os.path.relpath(
                              Path(cli.__file__).parent.parent / "tests/harness_methods.py"))):
        store.write_meta(d, {"baseline": "ring", "cells": ["ring-64", "x"], "source": source})
        assert cli.main(["show", str(d.relative_to(tmp_path))]) == 0
        assert f"`burst-bench run {shown} --out . --run-id" in capsys.readouterr().out
        assert Path(shown).exists() or shown == "smoke"
    # a spec outside the repository, named relative to where the run started, is recorded
    # absolute (the resume command printed from another folder named a path not there)
    _write(tmp_path, GOOD_TINY, "outside")
    assert load_spec(Path("outside.toml")).source == str(tmp_path / "outside.toml")
    # from the results folder, where a sweep folder `smoke/` shadows the spec's name
    (tmp_path / "smoke").mkdir()
    store.write_meta(d, {"baseline": "ring", "cells": ["ring-64", "x"],
                         "source": "suites/specs/smoke.toml"})
    assert cli.main(["show", str(d.relative_to(tmp_path))]) == 0
    shown = os.path.relpath(Path(cli.__file__).parent / "specs" / "smoke.toml")
    assert f"`burst-bench run {shown} --out . --run-id" in capsys.readouterr().out


def test_run_exit_code_signals_and_disk_errors(tmp_path, monkeypatch, capsys):
    """A run whose cells timed out exited 0; SIGTERM and SIGHUP end a run as Ctrl-C does;
    a full disk is a message with the path, not a traceback; no half-written table stays."""
    import errno
    import signal

    import pandas as pd

    from suites import run as run_mod

    class Res:
        run_dir = tmp_path
        table = pd.DataFrame({"status": ["ok", "timeout"]})

    monkeypatch.setattr(run_mod, "run_sweep", lambda *a, **k: Res())
    assert cli.main(["run", str(SPEC_DIR / "smoke.toml")]) == 1
    from burst import spawn

    monkeypatch.setattr(cli, "_main", lambda argv: signal.getsignal(signal.SIGTERM))
    assert cli.main([]) is spawn._terminate and signal.getsignal(signal.SIGTERM) is not \
        spawn._terminate  # installed while it runs, restored after
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        spawn._terminate(signal.SIGTERM, None)
    monkeypatch.undo()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "/results/x/rows.jsonl")

    monkeypatch.setattr(store, "load", full)
    assert cli.main(["show", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device (/results/x/rows.jsonl)" in err and "Traceback" not in err
    assert "a rerun resumes" not in err  # `show` resumes nothing (only `run` says so)
    for code, then in ((errno.ENOSPC, "rows written before it are kept and a rerun resumes"),
                       (errno.ENOENT, "a rerun measures the cells whose rows are not there")):
        def lost(*a, code=code, **k):  # a run's disk full, or its folder removed meanwhile
            raise OSError(code, os.strerror(code), "/results/x/rows.jsonl")

        monkeypatch.setattr(run_mod, "run_sweep", lost)
        assert cli.main(["run", str(SPEC_DIR / "smoke.toml")]) == 1
        assert capsys.readouterr().err.endswith(f"(/results/x/rows.jsonl); {then}\n")
    monkeypatch.undo()
    d = _run_dir(tmp_path, "20250101T000000Z-1", _rows([("ring", 64, 2.0, "ok")]))
    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    with pytest.raises(OSError):
        store.consolidate(d)
    assert not list(d.glob("*.tmp"))
    monkeypatch.undo()
    # run.json's write (and train.py's run.json and log, through the same replace_text) on a
    # full disk leaves the old file and no temporary one (a failure-injection audit found
    # run.tmp left, and the folder then an orphan run); a table half-written by a driver killed
    # while writing it goes with the table
    meta = (d / store.META).read_text()
    monkeypatch.setattr(store.os, "fsync", full)  # the text written, not yet synced
    with pytest.raises(OSError):
        store.write_meta(d, {"baseline": "x"})
    monkeypatch.undo()
    assert (d / store.META).read_text() == meta and not list(d.glob("*.tmp"))
    (d / (store.CSV + ".tmp")).write_text("half a ta")
    store.drop_tables(d)
    assert not list(d.glob("table*"))
    # a row's write on a full disk names the file (os.write's error names none)
    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "write", no_space)
    with pytest.raises(OSError) as e:
        store.append_row(d / store.ROWS, {"cell_id": "x", "status": "ok"})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(d / store.ROWS)


def test_the_cli_runs_outside_the_main_thread(capsys):
    """main() set its SIGTERM/SIGHUP handlers unconditionally: from a thread it raised
    'signal only works in main thread'."""
    import threading

    got = []
    t = threading.Thread(target=lambda: got.append(cli.main(["list"])))
    t.start()
    t.join(60)
    assert got == [0]


def test_finiteness_check_catches_inf_as_well_as_nan():
    """Only a NaN fixture existed: a check for NaN alone would let an fp16 overflow (inf) be an
    ok row with a time."""
    import math

    import torch

    from suites.measure import _finite

    ok = torch.ones(3)
    assert _finite((ok, ok, ok, ok)) and _finite(1.5) and _finite(None)
    assert not _finite((ok, ok, torch.tensor([1.0, math.inf]), ok))  # inf in one gradient
    assert not _finite((torch.tensor([math.nan]),)) and not _finite(math.inf)


def test_time_gate_ratio_is_the_median_of_interleaved_pairs(monkeypatch):
    """measure_ratio was only ever monkeypatched away in tests: a min (optimistic gate) or a
    running aggregate went unnoticed. A fake clock gives the pairs' ratios 1, 5, 2."""
    from suites import timegate

    ticks = iter([0, 1, 2, 3, 8, 9, 10, 12, 13])  # a: 1, b: 1 | a: 5, b: 1 | a: 2, b: 1
    monkeypatch.setattr(timegate.time, "perf_counter", lambda: next(ticks))
    assert timegate.measure_ratio(lambda: None, lambda: None, repeats=3, warmup=0) == 2


def test_failure_texts_classify_as_documented():
    """Each documented pattern of suites.rows (the second audit removed four without a test
    failing): SLURM's OUT_OF_MEMORY, a C++ bad_alloc, a gloo 'timed out', the local executor's
    'exceeded its time limit'."""
    assert classify("slurmstepd: error: State: OUT_OF_MEMORY") == "oom"
    assert classify("terminate called after throwing an instance of 'std::bad_alloc'") == "oom"
    assert classify("RuntimeError: [gloo] Connection timed out waiting for rank 1") == "timeout"
    assert classify("the job exceeded its time limit of 75 s without a result") == "timeout"
    # found by a harness audit: a hung rank under the local executor was an error row
    assert classify("rank 0 raised RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] "
                    "Timed out waiting 60000ms for recv operation to complete") == "timeout"
    assert classify("torch.distributed.DistStoreError: wait timeout after 60000ms") == "timeout"
    assert classify("Watchdog caught collective operation timeout: WorkNCCL(...)") == "timeout"
    assert classify('File "burst/comm.py", in init(timeout_s=60)\nValueError: x') == "error"
    assert classify("ValueError: bad input") == "error"


def test_labels_and_scales_do_not_depend_on_spelling():
    """A label must not depend on the order options are written in; a scale given as world and
    nodes puts world / nodes ranks on each node (both survived a mutation)."""
    from suites.spec import default_label, parse_spec

    assert default_label("burst", {"layout": "zigzag", "backward": "ring"}) == \
        default_label("burst", {"backward": "ring", "layout": "zigzag"})
    spec = parse_spec({"workload": "attention", "shape": {"heads": 4, "head_dim": 8},
                       "methods": [{"name": "ring"}],
                       "scales": [{"world": 8, "nodes": 2, "seq_lens": [64]}]}, name="s")
    (cell,) = expand(spec)
    assert (cell.world, cell.nodes, cell.ranks_per_node) == (8, 2, 4)


def test_a_sweep_folder_reads_its_newest_run_with_rows(tmp_path):
    """A run that died before its first row (run.json only, or the empty table a refused SLURM
    submission leaves) must not hide the run before it."""
    older = _run_dir(tmp_path, "20250101T000000Z-1", _rows([("ring", 64, 2.0, "ok")]))
    newer = tmp_path / "sweep" / "20250102T000000Z-1"
    newer.mkdir()
    store.write_meta(newer, {"baseline": "ring", "cells": ["ring-64"],
                             "created": "2025-01-02T00:00:00Z"})
    store.write_meta(older, {**store.read_meta(older), "created": "2025-01-01T00:00:00Z"})
    for table in (False, True):
        if table:
            store.consolidate(newer)  # what run_sweep writes when the executor raises
            assert (newer / store.TABLE).exists()
        assert store.latest_run(tmp_path / "sweep") == newer
        assert store.latest_run(tmp_path / "sweep", with_rows=True) == older
        assert list(store.load(tmp_path / "sweep")["cell_id"]) == ["ring-64"]


def test_an_impossible_cell_of_a_skip_invalid_method_is_a_skipped_row(tmp_path):
    from suites.executors import Run
    from suites.rows import RunContext
    from suites.run import _skip_invalid

    spec = load_spec(_write(tmp_path, 'workload = "attention"\nseq_lens = [64]\nworld = 4\n'
                            '[shape]\nheads = 2\nhead_dim = 8\n[[methods]]\nname = "ulysses"\n'
                            'skip_invalid = true\n'))  # 2 heads over 4 ranks: cannot run
    run = Run(tmp_path / "run")
    run.dir.mkdir()
    assert _skip_invalid(expand(spec), run, RunContext("r", "inline", "{}", None, None)) == []
    (row,) = store.read_rows(run.rows)
    assert row["status"] == "skipped" and "ulysses" in row["error"]


def test_a_cell_without_its_gpus_is_skipped_and_the_summary_gives_the_whole_reason(
        tmp_path, monkeypatch):
    """On a machine without enough GPUs a cuda cell is a skipped row that says what it needs;
    the summary printed its reason cut at 160 characters, mid-parenthesis, and now keeps it
    whole (a longer one is cut visibly, with "...")."""
    import torch

    from suites.executors import Run, _skip_if_too_few_gpus
    from suites.rows import RunContext
    from suites.run import WHY_CHARS, summary_text

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    spec = load_spec(_write(tmp_path, 'workload = "attention"\nseq_lens = [64]\nworld = 1\n'
                            'device = "cuda"\n[shape]\nheads = 2\nhead_dim = 8\n'
                            '[[methods]]\nname = "ring"\n'))
    run = Run(tmp_path / "run")
    run.dir.mkdir()
    ctx = RunContext("r", "inline", "{}", None, None)
    assert _skip_if_too_few_gpus(expand(spec), run, ctx) == []
    (row,) = store.read_rows(run.rows)
    why = ("needs 1 GPU on this machine (inline executor), found 0; resume the run with "
           "--retry-failed on a machine with 1 GPU, or with --executor slurm --retry-failed")
    assert row["status"] == "skipped" and row["error"] == why
    table = store.consolidate(run.dir)
    assert f"skipped: ring at seq_len@world 64@1: {why}\n" in summary_text(table)
    long = table.assign(error="x" * (WHY_CHARS + 1))
    assert f": {'x' * (WHY_CHARS - 4)} ...\n" in summary_text(long)  # (short_reason's cut)
    # a simulation has no resume: its summary does not offer --retry-failed
    assert "--retry-failed" in summary_text(table.assign(error="oom"))
    assert "--retry-failed" not in summary_text(table.assign(error="oom", source="simulated"))


def test_an_attention_key_in_a_train_step_method_names_its_workload(tmp_path):
    """The ONLY_FOR rule runs both ways in a method table: a train_step method's causal or
    heads (its model decides them) says which workload takes it, as checkpointing does."""
    text = ('workload = "train_step"\nmodel = "tiny"\nseq_lens = [64]\nworld = 2\n'
            '[[methods]]\nname = "burst"\ncausal = false\n')
    problems = _problems(tmp_path, text, "step")
    assert any("methods[0].causal" in p and "only applies to workload = 'attention'" in p
               for p in problems), problems


def test_a_train_step_spec_gives_its_model_a_window_or_local_and_global_layers(tmp_path):
    """window (and global_every) at a train_step spec's top level reach every cell as the
    model's per-layer windows; attention specs keep [shape] window; the spec's JSON of a
    spec without them is what it was."""
    head = ('workload = "train_step"\nmodel = "tiny"\nseq_lens = [64]\nworld = 2\n'
            '[[methods]]\nname = "burst"\n')
    every = load_spec(_write(tmp_path, 'window = [7, 0]\nglobal_every = 2\n' + head, "lg"))
    assert [c.window for c in expand(every)] == [((7, 0), None)]  # tiny: two layers
    assert json.loads(every.to_json())["global_every"] == 2
    one = load_spec(_write(tmp_path, 'window = [7, 0]\n' + head, "w"))
    assert [c.window for c in expand(one)] == [(7, 0)]
    plain = load_spec(_write(tmp_path, head, "p"))
    assert [c.window for c in expand(plain)] == [None]
    assert "window" not in json.loads(plain.to_json())
    for text, where, why in (
            ('window = [7]\n' + head, "window", "must be [left, right]"),
            ('global_every = 2\n' + head, "global_every", "needs window = [left, right]"),
            ('window = [7, 0]\nglobal_every = 0\n' + head, "global_every", ">= 1"),
            ('window = [7, 0]\nglobal_every = 1\n' + head, "global_every", "global (drop"),
            ('window = [7, 0]\nglobal_every = 3\n' + head, "global_every", "give 2"),
            ('window = [7, 0]\n' + head.replace("train_step", "attention").replace(
                'model = "tiny"\n', ""), "window", "only applies to workload = 'train_step'")):
        problems = _problems(tmp_path, text, "bad")
        assert any(p.startswith(where) and why in p for p in problems), (text, problems)
    # the only value for 2 layers is named as such ("give 2 to 2" before)
    assert _problems(tmp_path, 'window = [7, 0]\nglobal_every = 3\n' + head, "bad") == [
        "global_every: 3: every layer would be local (drop global_every); give 2"]


def test_a_model_with_its_own_window_takes_it_into_every_cell(tmp_path):
    """A named config with a window (ministral-8b: one global layer, then three of 32768 keys)
    gives it to every cell of a train_step spec, so the simulator, the FLOP counts and a run
    see the same model; a spec that gives it another window is refused, naming the model's."""
    head = ('workload = "train_step"\nmodel = "ministral-8b"\nseq_lens = [65536]\n'
            'world = 8\ndevice = "cuda"\ndtype = "bfloat16"\n'
            '[[methods]]\nname = "burst"\n')
    [cell] = expand(load_spec(_write(tmp_path, head, "own")))
    assert cell.window == get_config("ministral-8b").window
    assert cell.window[:4] == (None, (32767, 0), (32767, 0), (32767, 0))
    for extra in ('window = [7, 0]\n', 'window = [7, 0]\nglobal_every = 4\n'):
        problems = _problems(tmp_path, extra + head, "twice")
        assert any(p.startswith("window") and "model 'ministral-8b' has its own window "
                   "(global on 9 layers, [32767, 0] on 27 layers)" in p for p in problems), \
            problems
    # the shipped spec of it
    assert {c.window for c in expand(load_spec(SPEC_DIR / "engine_ministral.toml"))} == {
        get_config("ministral-8b").window}


def _problems(tmp_path, text: str, name: str) -> list[str]:
    """The problems load_spec raises for this spec text (it must raise)."""
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, text, name))
    return ei.value.problems


OWN_HEAD = ('workload = "train_step"\nmodel = "mine"\nseq_lens = [4096]\nworld = 8\n'
            'device = "cuda"\ndtype = "bfloat16"\n[[methods]]\nname = "burst"\n')
# Llama-3-8B's fields (burst.engine.configs "llama3-8b") as a [model_config] table and as the
# Hugging Face config.json it comes from
OWN_TABLE = ("[model_config]\nhidden_size = 4096\nnum_layers = 32\nnum_heads = 32\n"
             "num_kv_heads = 8\nffn_size = 14336\nvocab_size = 128256\nrope_theta = 5e5\n"
             "rms_eps = 1e-5\n")
OWN_HF = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
              vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5, hidden_act="silu")


def test_a_spec_defines_its_own_model_as_a_table_or_a_hugging_face_config(tmp_path):
    """A model that no config names (issue 6: a run planned for the user's own model): the
    spec's [model_config] table, or the Hugging Face config.json it names (read relative to the
    spec's file, not the working directory), becomes every field of a ModelConfig that the
    cells carry under the spec's model name; the same model either way is the same cells."""
    want = dataclasses.asdict(get_config("llama3-8b"))
    table = load_spec(_write(tmp_path, OWN_HEAD + OWN_TABLE, "table"))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.json").write_text(json.dumps(OWN_HF))
    hf = load_spec(_write(tmp_path, OWN_HEAD.replace(
        'model = "mine"\n', 'model = "mine"\nmodel_config = "models/mine.json"\n'), "hf"))
    assert table.model_config == hf.model_config == want
    assert json.loads(table.to_json())["model_config"] == want  # the rows' spec column
    [a], [b] = expand(table), expand(hf)
    assert a.cell_id == b.cell_id and a.model == "mine" and a.model_config == want
    assert (a.heads, a.kv_heads, a.head_dim) == (32, 8, 128)
    assert a.config() == get_config("llama3-8b")
    assert type(a).from_json(a.to_json()) == a  # cells travel to ranks and jobs as JSON
    # a field that changes the model changes the cells; the built-in config is another id
    other = load_spec(_write(tmp_path, OWN_HEAD + OWN_TABLE.replace("= 32\nnum_heads",
                                                                    "= 30\nnum_heads"), "o"))
    assert expand(other)[0].cell_id != a.cell_id
    built_in = load_spec(_write(tmp_path, OWN_HEAD.replace('"mine"', '"llama3-8b"'), "b"))
    [c] = expand(built_in)
    assert c.model_config is None and "model_config" not in json.loads(built_in.to_json())
    assert "model_config" not in c.identity()  # the ids of every stored cell stay theirs
    # 500000 and 5e5 are one model: one id (an int kept in a float field was another cell)
    whole = load_spec(_write(tmp_path, OWN_HEAD + OWN_TABLE.replace("5e5", "500000"), "int"))
    assert expand(whole)[0].cell_id == a.cell_id
    # the model's own window reaches the cells, as a named config's does, and its cells travel
    # as JSON unchanged (the window's pairs came back as lists: a cell unequal to itself)
    windowed = load_spec(_write(tmp_path, OWN_HEAD + OWN_TABLE + "window = [4095, 0]\n", "w"))
    assert expand(windowed)[0].window == (4095, 0)
    (tmp_path / "models" / "mixed.json").write_text(json.dumps(dict(
        OWN_HF, model_type="ministral", num_hidden_layers=2, sliding_window=16,
        layer_types=["full_attention", "sliding_attention"])))
    mixed = load_spec(_write(tmp_path, OWN_HEAD.replace(
        'model = "mine"\n', 'model = "mine"\nmodel_config = "models/mixed.json"\n'), "mx"))
    for c in (*expand(windowed), *expand(mixed)):
        assert type(c).from_json(c.to_json()) == c
    assert expand(mixed)[0].window == (None, (15, 0))
    assert any("model 'mine' has its own window" in p for p in _problems(
        tmp_path, "window = [7, 0]\n" + OWN_HEAD + OWN_TABLE + "window = [4095, 0]\n", "w2"))


def test_a_top_level_key_below_a_table_is_named_as_one(tmp_path):
    """TOML reads every key after a [table] header into that table: seq_lens written under
    [model_config], or baseline under the last [[methods]], was an "unknown key" of that table
    with a guess at a key of it (a review of the own-model change)."""
    out = _problems(tmp_path, OWN_HEAD.replace("seq_lens = [4096]\n", "") + 'baseline = "b"\n'
                    + OWN_TABLE + "seq_lens = [4096]\n", "trap")
    why = "is a top-level key: TOML reads every key after a [table] header into that table"
    assert any(p.startswith("model_config.seq_lens: unknown key ('seq_lens' " + why)
               for p in out), out
    assert any(p.startswith("methods[0].baseline: unknown key ('baseline' " + why)
               for p in out), out
    # a key that is no top-level key keeps its guess
    out = _problems(tmp_path, GOOD_TINY.replace("head_dim = 8", "head_dim = 8\nhaeds = 2"), "g")
    assert any(p.startswith("shape.haeds: unknown key (did you mean 'heads'?)") for p in out), out


def test_a_spec_s_own_model_is_refused_with_every_problem_named(tmp_path):
    def problems(top: str, table: str = "", name="p") -> list[str]:
        """The spec's problems with ``top`` as its first lines and ``table`` as its last."""
        return _problems(tmp_path, top + OWN_HEAD.replace('model = "mine"\n', "") + table,
                         name)

    out = problems('model = "mine"\n', "[model_config]\nhidden_size = 48\nnum_layrs = 2\n")
    assert any(p.startswith("model_config.num_layrs: unknown key (did you mean 'num_layers'")
               for p in out), out
    assert "model_config: missing num_layers, num_heads, num_kv_heads, ffn_size, vocab_size " \
           "(required)" in out
    out = problems('model = "mine"\n', OWN_TABLE.replace("num_kv_heads = 8", "num_kv_heads = 3"))
    assert any(p.startswith("model_config: ModelConfig: num_heads=32 is not divisible by "
                            "num_kv_heads=3") for p in out), out
    out = problems('model = "llama3-8b"\n', OWN_TABLE)  # rows would show two models as one
    assert any(p.startswith("model: 'llama3-8b' is a built-in config") for p in out), out
    assert any(p == "model: required" for p in problems("", OWN_TABLE)), problems("", OWN_TABLE)
    out = problems('model = "mine"\nmodel_config = "none.json"\n')
    assert any(p.startswith("model_config: 'none.json': cannot read ") and
               str(tmp_path / "none.json") in p for p in out), out
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "scaled.json").write_text(json.dumps(
        {**OWN_HF, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    out = problems('model = "mine"\nmodel_config = "list.json"\n')
    assert any("holds a JSON list, not a Hugging Face config" in p for p in out), out
    out = problems('model = "mine"\nmodel_config = "scaled.json"\n')  # config_from_hf refuses
    assert any(p.startswith("model_config: 'scaled.json': ") and "rope type 'llama3'" in p
               for p in out), out
    # a config.json's values of the wrong kind (a review: a traceback, or "false" read as true)
    for i, (key, value, why) in enumerate((
            ("rope_scaling", "linear", "rope_scaling='linear' must be a table of RoPE "),
            ("tie_word_embeddings", "false", "tie_word_embeddings='false' must be a bool"),
            ("rms_norm_eps", "x", "rms_norm_eps='x' must be a positive number"),
            ("hidden_size", "4096", "hidden_size='4096' must be a positive integer"),
            ("rope_theta", 10**400, "rope_theta=1000"))):  # (an OverflowError in float())
        (tmp_path / f"odd{i}.json").write_text(json.dumps({**OWN_HF, key: value}))
        out = problems(f'model = "mine"\nmodel_config = "odd{i}.json"\n', name=f"odd{i}")
        assert any(p.startswith(f"model_config: 'odd{i}.json': ") and why in p for p in out), out
    out = problems('model = "mine"\n', OWN_TABLE.replace("14336", "99999999999999999999"))
    assert any("ffn_size=99999999999999999999 must be a positive integer <= 2**40" in p
               for p in out), out  # (it was priced, and its bytes broke the result table)
    # layers past 65536 (per-layer lists exhausted the memory of the machine pricing 2**40 of
    # them), and a width of 2**40 that its heads do not divide (listing the valid head counts
    # counted to 2**40: a hang)
    out = problems('model = "mine"\n', OWN_TABLE.replace("num_layers = 32", "num_layers = 65537"))
    assert any("num_layers=65537 must be a positive integer <= 65536" in p for p in out), out
    out = problems('model = "mine"\n', OWN_TABLE.replace("hidden_size = 4096",
                                                         f"hidden_size = {2**40}")
                   .replace("num_heads = 32", "num_heads = 3"))
    assert any(f"hidden_size={2**40} is not divisible by num_heads=3; valid head counts: 1, 2, "
               "4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, ..." in p for p in out), out
    out = problems('model = "mine"\n', OWN_TABLE.replace("5e5", "1" + "0" * 400))
    assert any(p.startswith("model_config: ModelConfig: rope_theta=1000") and
               p.endswith("must be a positive number") for p in out), out  # (OverflowError)
    out = problems('model = ""\n', OWN_TABLE)
    assert any(p.startswith("model: '' is empty") for p in out), out
    out = problems('model = "mine"\nmodel_config = 3\n')
    assert any(p.startswith("model_config: 3 is of type int; expected a table") for p in out)
    out = problems('model = "nosuch"\n')
    assert any(p.startswith("model: unknown model config 'nosuch'") and "[model_config]" in p
               for p in out), out
    out = _problems(tmp_path, 'model_config = "x.json"\n' + GOOD_TINY, "attn")
    assert out == ["model_config: only applies to workload = 'train_step' (attention uses "
                   "[shape])"], out


def test_run_exit_code_is_0_when_cells_ran_out_of_memory_or_were_skipped_unless_none_ran(
        tmp_path, monkeypatch, capsys):
    """oom and skipped are results (the cell cannot run there), not a failed run, unless no
    cell ran at all (every one skipped: exit 1)."""
    import pandas as pd

    from suites import run as run_mod

    class Res:
        run_dir = tmp_path
        table = pd.DataFrame({"status": ["ok", "oom", "skipped"]})

    monkeypatch.setattr(run_mod, "run_sweep", lambda *a, **k: Res())
    assert cli.main(["run", str(SPEC_DIR / "smoke.toml")]) == 0
    # a sweep of which no cell ran at all (no GPU here, no length any layout splits) measured
    # nothing: it said nothing and exited 0 (a harness audit); every cell oom is a finding
    Res.table = pd.DataFrame({"status": ["skipped", "skipped"]})
    assert cli.main(["run", str(SPEC_DIR / "smoke.toml")]) == 1
    assert "nothing was measured: no cell of 2 ran to a number (2 skipped)" in (
        capsys.readouterr().err)
    Res.table = pd.DataFrame({"status": ["oom", "skipped"]})
    assert cli.main(["run", str(SPEC_DIR / "smoke.toml")]) == 0
    assert "nothing was measured" in capsys.readouterr().err


def test_a_torn_last_line_given_its_newline_is_ignored_by_readers(tmp_path):
    """read_rows skips a torn last line whether or not an editor gave it a newline."""
    rows = tmp_path / "rows.jsonl"
    store.append_row(rows, {"cell_id": "c0", "status": "ok"})
    with open(rows, "ab") as f:
        f.write(b'{"cell_id": "c1", "sta\n')
    assert [r["cell_id"] for r in store.read_rows(rows)] == ["c0"]


def test_a_bad_line_before_a_last_line_without_newline_is_an_error(tmp_path):
    """Only the last line with text can be a torn write: a bad line before a last row that
    lacks its newline was read as "the last line" and dropped without a word."""
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"cell_id": "a", "status": "ok"}\n{"cell_id": "b", "sta\n'
                     b'{"cell_id": "c", "status": "ok"}')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        store.read_rows(rows)
    store.repair(rows)  # gives the whole last row its newline: the same verdict after it
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        store.read_rows(rows)


def test_loading_a_runs_rows_file_or_csv_keeps_what_its_folder_gives(tmp_path):
    """store.load of a run's rows.jsonl has the run's speedups and cell order, as the folder
    does; a table.csv keeps a label "NA" a label (pandas read it as missing)."""
    rows = _rows([("NA", 64, 1.0, "ok"), ("ring", 64, 2.0, "ok")])
    d = _run_dir(tmp_path, "20250101T000000Z-1", rows)
    assert store.consolidate(d)["speedup"].tolist() == [2.0, 1.0]  # and writes table.csv
    for got in (store.load(d / store.ROWS), store.load(d / store.CSV)):
        assert got["label"].tolist() == ["NA", "ring"]
        assert got["speedup"].tolist() == [2.0, 1.0]
    # rows appended out of the sweep's order (parallel jobs finish as they do) are tabled in
    # its order (a table without the sort passed a test audit)
    rows = _rows([("ring", 64, 2.0, "ok"), ("burst", 64, 1.0, "ok"), ("ring", 128, 4.0, "ok")])
    d = _run_dir(tmp_path, "20250101T000000Z-2", rows[::-1])
    store.write_meta(d, {"baseline": "ring", "cells": [r["cell_id"] for r in rows]})
    assert store.consolidate(d)["cell_id"].tolist() == ["ring-64", "burst-64", "ring-128"]


def test_compare_matches_a_whole_float_key_with_its_int():
    """A key column with one empty value is float in pandas: its 1.0 is the other table's 1
    (every cell was "missing", said as "nodes: 1 in a, 1.0 in b")."""
    import pandas as pd

    base = dict(workload="attention", seq_len=8192, world=2, nodes=1, status="ok",
                label="ring", time_s=1.0)
    a = pd.DataFrame([base, {**base, "seq_len": 16384}])
    b = pd.DataFrame([{**base, "time_s": 2.0}, {**base, "seq_len": 16384, "nodes": None}])
    assert b["nodes"].dtype == float
    c = compare(a, b, "time_s").set_index("seq_len")
    assert c.loc[8192, "status_b"] == "ok" and c.loc[8192, "ratio"] == pytest.approx(2.0)
    assert c.loc[16384, "status_b"] == "missing"  # no nodes is not one node


def test_rows_and_run_meta_reach_the_disk(tmp_path, monkeypatch):
    """append_row fsyncs the rows file; write_meta fsyncs its temporary file before the
    rename (a crash leaves the old run.json or the new one, never an empty one)."""
    import os

    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(
        os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))), real(fd))[1])
    store.append_row(tmp_path / store.ROWS, {"cell_id": "c0", "status": "ok"})
    assert synced == [store.ROWS]
    store.write_meta(tmp_path, {"cells": ["c0"]})
    assert synced == [store.ROWS, "run.json.tmp"] and store.read_meta(tmp_path) == {"cells": ["c0"]}


def test_a_failed_table_write_leaves_the_previous_table_whole(tmp_path, monkeypatch):
    """consolidate writes each table beside it and renames it: a disk that fills mid-write
    leaves the previous table.csv, not half of the new one."""
    import errno
    from pathlib import Path

    import pandas as pd

    d = _run_dir(tmp_path, "20250101T000000Z-1", _rows([("ring", 64, 2.0, "ok")]))
    store.consolidate(d)
    before = (d / store.CSV).read_bytes()
    store.append_row(d / store.ROWS, _rows([("burst", 64, 1.0, "ok")])[0])

    to_csv = pd.DataFrame.to_csv

    def torn(self, path=None, **kw):
        if path is None:  # the text that consolidate compares with the table it has
            return to_csv(self, **kw)
        Path(path).write_text("cell_id,sta")  # half a table, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(pd.DataFrame, "to_csv", torn)
    with pytest.raises(OSError):
        store.consolidate(d)
    assert (d / store.CSV).read_bytes() == before and not list(d.glob("*.tmp"))


def test_a_run_folder_without_run_json_is_not_resumed(tmp_path):
    """A folder with rows but no run.json is no run of this spec: a new run is started (only
    a named --run-id takes it)."""
    from suites.run import select_run

    a = load_spec(_write(tmp_path, GOOD, "sweep"))
    out = tmp_path / "out"
    stray = out / a.name / "20260101T000000Z-1"
    stray.mkdir(parents=True)
    store.append_row(stray / store.ROWS, {"cell_id": expand(a)[0].cell_id, "status": "ok"})
    assert select_run(a, out) != stray
    assert select_run(a, out, run_id=stray.name) == stray  # its rows are this spec's cells


def test_no_speedup_against_a_baseline_cell_that_failed():
    """A baseline row that failed (wrong results keep their time) is no baseline."""
    import pandas as pd

    df = pd.DataFrame(_rows([("ring", 64, 2.0, "error"), ("burst", 64, 1.0, "ok")]))
    assert pd.isna(add_speedup(df, "ring").set_index("cell_id").loc["burst-64", "speedup"])


def test_a_resumed_run_holds_no_stale_table_while_it_adds_rows(tmp_path, monkeypatch):
    """A resumed run killed with SIGKILL kept the table of its first attempt next to more rows
    (pd.read_parquet read it silently); now the table is gone until the driver writes it. And
    rows of other code than the resumed cells' are named (they silently shared one table)."""
    import pandas as pd

    from suites import run as runmod

    spec, cells, run = _run_of_spec(tmp_path)

    def row(c):
        return dict(empty_row(), cell_id=c.cell_id, label=c.label, status="ok", time_s=1.0,
                    seq_len=c.seq_len, world=c.world)

    store.append_row(run / "rows.jsonl", row(cells[0]))
    store.consolidate(run)
    seen = []

    def measure(todo, run_, ctx):
        seen.append([(run / n).exists() for n in ("table.parquet", "table.csv")])
        for c in todo:
            store.append_row(run_.rows, row(c))

    monkeypatch.setattr(runmod, "run_inline", measure)
    buf = io.StringIO()
    runmod.run_sweep(spec, out=tmp_path / "out", run_id="r1", stream=buf)
    assert seen == [[False, False]]
    assert len(pd.read_csv(run / "table.csv")) == len(cells)
    # the first row came from other code (empty_row has no commit): the resumed run says so
    assert "note: this run's rows so far come from code unknown; the cells added now run on" \
        in buf.getvalue()
    # and so when neither side's commit is known (a checkout without .git): unknown is not same
    buf = io.StringIO()
    unknown = runmod.RunContext(run_id="r1", executor="inline", sweep_spec="{}",
                                git_commit=None, git_dirty=None)
    runmod._warn_mixed_code([{"git_commit": None}], unknown, buf)
    assert "come from code unknown; the cells added now run on unknown" in buf.getvalue()
    # a driver that fails (SLURM refused the array, a full disk) still writes what ran
    store.append_row(run / "rows.jsonl", dict(row(cells[0]), status="error"))  # to retry
    store.drop_tables(run)

    def refused(todo, run_, ctx):
        raise RuntimeError("refused")

    monkeypatch.setattr(runmod, "run_inline", refused)
    with pytest.raises(RuntimeError, match="refused"):
        runmod.run_sweep(spec, out=tmp_path / "out", run_id="r1", retry_failed=True,
                         stream=io.StringIO())
    assert len(pd.read_csv(run / "table.csv")) == len(cells)


def test_every_scaled_metric_heading_ends_with_its_unit():
    """compare takes a scaled value's unit from the end of its heading: MiB values were shown
    under a bytes heading, and one column was headed "(busiest fwd + busiest bwd)"."""
    import re

    from results.tables import METRICS

    # and the scale is that unit's, from the column's own unit (s, bytes, a fraction): a MiB
    # heading over 1e-6 (1 GiB shown as 1073.7) or a % heading over 1 passed (a test audit)
    per_unit = {"ms": 1e3, "MiB": 2.0**-20, "%": 100.0}
    for metric, (heading, scale, _, _) in METRICS.items():
        unit = re.fullmatch(r".* \((ms|MiB|%)\)", heading)
        scaled = metric == "time_s" or metric.startswith("mfu_") or "bytes" in metric
        assert bool(unit) == scaled and (scale != 1) == scaled, (metric, heading, scale)
        if unit:
            assert scale == per_unit[unit[1]], (metric, heading, scale)
            assert {"ms": "time_s", "MiB": "bytes", "%": "mfu_"}[unit[1]] in metric, metric


def test_show_names_a_newest_run_that_has_no_row_yet(tmp_path, capsys):
    """A run whose driver died with its jobs queued: `show <run>` said only that the folder
    holds no rows, and `show <sweep>` showed an older run as if it were the latest."""
    rows = _rows([("ring", 64, 2.0, "ok"), ("burst", 64, 1.0, "ok")])
    old = _run_dir(tmp_path, "20250101T000000Z-1", rows)
    new = tmp_path / "sweep" / "20250102T000000Z-2"
    new.mkdir()
    store.write_meta(new, {"cells": ["a", "b", "c"], "created": "2025-01-02T00:00:00Z"})
    store.write_meta(old, {**store.read_meta(old), "created": "2025-01-01T00:00:00Z"})
    store.append_row(new / "jobs.jsonl", {"cell_id": "a", "job_id": "5_0", "kind": "slurm"})
    (new / store.ROWS).write_bytes(b'{"cell_id": "a", "sta')  # a torn first row is no row
    note = ("run 20250102T000000Z-2 has no row yet (3 cells, 1 with submitted jobs not yet "
            f"collected): `burst-bench run <its spec> --out {tmp_path} --run-id "
            "20250102T000000Z-2` collects and resumes it")
    assert cli.main(["show", str(new)]) == 0
    assert capsys.readouterr().out.strip() == note
    assert cli.main(["show", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "speedup vs ring" in out and f"shown: run {old.name}; {note}" in out
    # two runs with rows: the one shown is named (a run resumed by another spec is not the
    # latest created, and its table was taken for the other's)
    newer = _run_dir(tmp_path, "20250103T000000Z-3",
                     _rows([("ring", 64, 7.25, "ok"), ("burst", 64, 1.0, "ok")]))
    store.write_meta(newer, {**store.read_meta(newer), "created": "2025-01-03T00:00:00Z"})
    assert cli.main(["show", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "7250.0" in out  # its table (ms), not the older run's
    assert f"shown: run {newer.name}, the latest created of 3 runs in {tmp_path / 'sweep'}" in out
    assert cli.main(["show", str(newer)]) == 0
    assert "shown:" not in capsys.readouterr().out


def test_a_cell_with_another_executors_job_uncollected_is_not_run_twice(tmp_path, monkeypatch):
    """A harness audit: a local run whose driver alone was interrupted (its job running on),
    resumed with the inline executor, measured the cell again beside that job, both timings on
    the same cores, and the job was never collected. A job that ended is no obstacle."""
    import sys

    from suites import run as runmod

    spec, cells, run = _run_of_spec(tmp_path)
    ran = []
    monkeypatch.setattr(runmod, "run_inline", lambda todo, run_, ctx: ran.extend(todo))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "submitit"])
    try:
        store.append_row(run / "jobs.jsonl", {"cell_id": cells[0].cell_id, "job_id": "7",
                                              "kind": "local", "pid": live.pid, "tasks": 1})
        store.append_row(run / "jobs.jsonl", {"cell_id": cells[1].cell_id, "job_id": "8_0",
                                              "kind": "slurm", "tasks": 1})
        with pytest.raises(ValueError, match=r"run r1 has jobs of an earlier driver not yet "
                           r"collected \(1 local; 1 slurm\): resume it with --executor local "
                           r"or --executor slurm"):
            runmod.run_sweep(spec, out=tmp_path / "out", run_id="r1", stream=io.StringIO())
        assert ran == []
    finally:
        live.kill()
        live.wait()
    (run / "jobs.jsonl").unlink()  # the local job ended without a row: the cell runs again
    store.append_row(run / "jobs.jsonl", {"cell_id": cells[0].cell_id, "job_id": "7",
                                          "kind": "local", "pid": live.pid, "tasks": 1})
    runmod.run_sweep(spec, out=tmp_path / "out", run_id="r1", stream=io.StringIO())
    assert [c.cell_id for c in ran] == [c.cell_id for c in cells]


def test_a_run_kept_as_its_table_alone_is_shown_and_never_measured_over(tmp_path, capsys,
                                                                          monkeypatch):
    """A run whose rows file is gone but whose table holds its rows (the store reads such a
    run): `show` said it had no row, and `run` took every cell as not done, deleted the table
    and measured them all again (killed then, the measured rows were lost). `show` prints the
    table; `run` refuses the run and leaves it as it was (a harness audit)."""
    from suites import run as runmod

    spec, cells, run = _run_of_spec(tmp_path)
    for i, c in enumerate(cells):
        r = empty_row()
        r.update(cell_id=c.cell_id, label=c.label, method=c.method, seq_len=c.seq_len,
                 world=c.world, workload="attention", status="ok", time_s=1.0 + i, index=i)
        store.append_row(run / store.ROWS, r)
    store.consolidate(run)
    (run / store.ROWS).unlink()
    before = (run / store.TABLE).read_bytes()
    assert cli.main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "no row yet" not in out and "time per step" in out, out
    monkeypatch.setattr(runmod, "run_inline", lambda *a: pytest.fail("measured again"))
    with pytest.raises(ValueError, match="is kept as its table alone .no rows.jsonl.: it cannot "
                                         "be resumed; --new measures"):
        runmod.run_sweep(spec, out=tmp_path / "out", run_id="r1", stream=io.StringIO())
    # and its dry run says so (it listed every cell as a job to submit, exit 0)
    with pytest.raises(ValueError, match="is kept as its table alone"):
        runmod.run_sweep(spec, out=tmp_path / "out", run_id="r1", executor="dry-run",
                         stream=io.StringIO())
    assert (run / store.TABLE).read_bytes() == before and (run / "table.csv").exists()


def test_an_edited_spec_names_the_unfinished_run_it_leaves(tmp_path, monkeypatch):
    """An edited spec starts a new run, as documented; the interrupted run of the earlier spec
    was left without a word (and the user took the new run for a resumed one)."""
    from suites import run as runmod

    spec = load_spec(_write(tmp_path, GOOD, "sweep"))
    cells = expand(spec)
    old = tmp_path / "out" / spec.name / "r1"
    old.mkdir(parents=True)
    store.write_meta(old, {"spec_hash": runmod._spec_hash(spec), "baseline": spec.baseline,
                           "cells": [c.cell_id for c in cells],
                           "created": "2026-01-01T00:00:00Z"})
    store.append_row(old / "rows.jsonl", dict(empty_row(), cell_id=cells[0].cell_id,
                                              label=cells[0].label, status="ok"))
    monkeypatch.setattr(runmod, "run_inline", lambda todo, run_, ctx: [
        store.append_row(run_.rows, dict(empty_row(), cell_id=c.cell_id, label=c.label,
                                         status="ok", time_s=1.0, seq_len=c.seq_len,
                                         world=c.world)) for c in todo])
    buf = io.StringIO()
    res = runmod.run_sweep(dataclasses.replace(spec, repeats=spec.repeats + 1),
                           out=tmp_path / "out", stream=buf)
    assert res.run_dir != old
    assert (f"note: run r1 of this sweep, of another spec, has {len(cells) - 1} of "
            f"{len(cells)} cells without a row") in buf.getvalue()
    buf = io.StringIO()  # the new run is complete: starting a third says nothing of it
    runmod.run_sweep(dataclasses.replace(spec, repeats=spec.repeats + 2), out=tmp_path / "out",
                     stream=buf)
    assert "note: run" not in buf.getvalue()
    # nor a named new run of the very spec of the unfinished one (it is not "another spec")
    store.write_meta(old, {**store.read_meta(old), "created": "2099-01-01T00:00:00Z"})
    buf = io.StringIO()
    runmod.run_sweep(spec, out=tmp_path / "out", run_id="mine", stream=buf)
    assert "note: run" not in buf.getvalue()
    # nor does an older run with a broken rows file stop a new run
    (old / "rows.jsonl").write_text("garbage\n" + (old / "rows.jsonl").read_text())
    store.write_meta(old, {**store.read_meta(old), "created": "2099-01-02T00:00:00Z"})
    buf = io.StringIO()
    third = dataclasses.replace(spec, repeats=spec.repeats + 3)
    done = runmod.run_sweep(third, out=tmp_path / "out", stream=buf).run_dir
    assert "note: run" not in buf.getvalue()
    # a finished run of cells the edited spec keeps (a method added): those are measured again,
    # which a harness audit found said nowhere
    extra = dataclasses.replace(third.methods[0], label="extra")
    more = dataclasses.replace(third, methods=(*third.methods, extra))
    store.write_meta(old, {**store.read_meta(old), "created": "2000-01-01T00:00:00Z"})
    store.write_meta(done, {**store.read_meta(done), "created": "2099-01-03T00:00:00Z"})
    buf = io.StringIO()
    measured = runmod.run_sweep(more, out=tmp_path / "out", stream=buf).run_dir
    n, kept = len(expand(more)), len(expand(third))
    assert kept < n
    assert (f"note: run {done.name} of this sweep, of another spec, has rows of {kept} of these "
            f"{n} cells; this spec starts a new run, which measures every cell") in buf.getvalue()
    # a run whose run.json is gone: its spec is unknown, not another; named, it resumes
    (done / "run.json").unlink()
    os.utime(done, (4102444800, 4102444800))  # 2100: the newest run, sorted by its time
    shutil.rmtree(measured)  # (else that run of this spec is resumed)
    buf = io.StringIO()
    measured = runmod.run_sweep(more, out=tmp_path / "out", stream=buf).run_dir
    assert (f"note: run {done.name} of this sweep has no run.json (its spec unknown) and "
            f"rows of {kept} of these {n} cells; this spec starts a new run, which measures "
            f"every cell (--run-id {done.name} resumes that one instead)") in buf.getvalue(), \
        buf.getvalue()
    # with a row of a cell this spec lacks, --run-id would refuse it: not offered
    store.append_row(done / "rows.jsonl", dict(empty_row(), cell_id="elsewhere", status="ok"))
    os.utime(done, (4102444800, 4102444800))
    shutil.rmtree(measured)
    buf = io.StringIO()
    runmod.run_sweep(more, out=tmp_path / "out", stream=buf)
    assert (f"rows of {kept} of these {n} cells; this spec starts a new run, which measures "
            "every cell\n") in buf.getvalue(), buf.getvalue()


def test_a_paper_entry_that_changes_the_system_does_not_keep_its_label(tmp_path):
    """A harness audit: {paper = "deepspeed_ulysses", name = "ring"} ran ring labelled
    "Deepspeed-Ulysses", the label its rows are matched to the published ones by."""
    text = ('workload = "train_step"\nmodel = "tiny"\nseq_lens = [64]\nworld = 2\n'
            '[[methods]]\npaper = "burstengine"\n'
            '[[methods]]\npaper = "burstengine"\ncheckpointing = "full"\n'
            '[[methods]]\npaper = "megatron_cp"\noptions = { grad_acc = "fp32" }\n'
            '[[methods]]\npaper = "deepspeed_ulysses"\nname = "ring"\nfused_head = true\n'
            '[[methods]]\npaper = "burstengine"\ncheckpointing = "full"\nlabel = "Mine"\n')
    spec = load_spec(_write(tmp_path, text, "paper_labels"))
    assert [m.label for m in spec.methods] == [
        "Burst-Ring", "Burst-Ring [checkpointing=full]", "Megatron [grad_acc=fp32]",
        "Deepspeed-Ulysses [name=ring,fused_head=true]", "Mine"]


def test_top_level_lengths_that_no_scale_uses_are_refused(tmp_path):
    """A harness audit: top-level seq_lens were dropped without a word (never run, never
    checked) when every [[scales]] entry gave its own."""
    text = ('workload = "attention"\nseq_lens = [999999, 4096]\n[shape]\nheads = 2\n'
            'head_dim = 8\n[[methods]]\nname = "ring"\n[[scales]]\nworld = 2\nseq_lens = [256]\n')
    with pytest.raises(SpecError, match="every \\[\\[scales\\]\\] entry gives its own seq_lens"):
        load_spec(_write(tmp_path, text, "lens"))
    both = text.replace("999999", "512").replace("seq_lens = [256]\n",
                                                  "seq_lens = [256]\n[[scales]]\nworld = 4\n")
    scales = load_spec(_write(tmp_path, both, "lens2")).scales  # one entry uses them: fine
    assert [list(s.seq_lens) for s in scales] == [[256], [512, 4096]]


def test_cpu_ranks_beyond_the_cores_are_named(tmp_path, monkeypatch):
    """A harness audit: world 8 on 2 cores printed "ok 76.1 ms" as if it meant speed."""
    import os

    from suites import run as runmod

    spec = load_spec(_write(tmp_path, GOOD, "sweep"))
    monkeypatch.setattr(runmod, "run_inline", lambda todo, run_, ctx: None)
    worlds = max(c.world for c in expand(spec))
    for cores, said in ((worlds - 1, True), (worlds, False)):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        buf = io.StringIO()
        runmod.run_sweep(spec, out=tmp_path / f"out{cores}", stream=buf)
        assert (f"note: up to {worlds} CPU ranks on {cores} cores" in buf.getvalue()) == said


def test_a_named_run_without_run_json_takes_only_this_specs_rows(tmp_path):
    """A harness audit: --run-id on a folder without run.json resumed it with any spec, and
    another spec's rows (a longer length) landed in this one's table."""
    from suites.run import select_run

    spec = load_spec(_write(tmp_path, GOOD, "sweep"))
    mine = expand(spec)[0].cell_id
    run = tmp_path / "out" / spec.name / "orphan"
    run.mkdir(parents=True)
    assert select_run(spec, tmp_path / "out", "orphan") == run  # empty: fine
    store.append_row(run / store.ROWS, {"cell_id": mine, "status": "ok"})
    assert select_run(spec, tmp_path / "out", "orphan") == run  # its own rows: fine
    store.append_row(run / store.ROWS, {"cell_id": "not-of-this-spec", "status": "ok"})
    with pytest.raises(ValueError, match="has no run.json, and rows of 1 cells that are not"):
        select_run(spec, tmp_path / "out", "orphan")


def test_compare_names_the_commits_and_machines_when_they_differ(tmp_path, capsys):
    """A fresh-user audit: a committed run of another commit and machine compared with one's
    own said nothing of it; the ratio is then not the code's alone."""
    a = _run_dir(tmp_path, "a", _rows([("ring", 64, 2.0, "ok")], git_commit="1111111111",
                                      hostname="vm"))
    b = _run_dir(tmp_path, "b", _rows([("ring", 64, 1.0, "ok")], git_commit="2222222222",
                                      hostname="laptop-of-a-user"))
    assert cli.main(["compare", str(a), str(b)]) == 0
    assert ("note: a comes from commit 11111111 on vm, b from commit 22222222 on "
            "laptop-of-a-user") in (
        capsys.readouterr().out)
    assert cli.main(["compare", str(a), str(a)]) == 0
    assert "note:" not in capsys.readouterr().out


def test_compare_names_the_run_it_took_and_the_cells_only_b_has(tmp_path, capsys):
    """A harness audit: compare left out the cells only b ran without a word, and did not say
    which run of a sweep folder it read."""
    a = _run_dir(tmp_path, "a", _rows([("ring", 64, 2.0, "ok")]))
    b = _run_dir(tmp_path, "b", _rows([("ring", 64, 1.0, "ok"), ("ring", 512, 3.0, "ok"),
                                       ("burst", 512, 2.5, "ok")]))
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "note: 2 cell(s) of b have no match in a and are not compared: ring 512, burst 512" \
        in out, out
    assert "latest run" not in out
    assert cli.main(["compare", str(a), str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert f"note: b is {b}, the latest run of {tmp_path / 'sweep'} with rows" in out, out
    assert cli.main(["compare", str(b), str(a)]) == 0
    assert "no match in" not in capsys.readouterr().out  # a's cells missing from b are rows


def test_a_finished_run_resumed_says_nothing_ran_and_whose_rows_it_shows(tmp_path, monkeypatch):
    """A fresh-user audit: `burst-bench run smoke` on a fresh clone resumed the committed run of
    another commit and machine, ran nothing and reprinted its table without a word."""
    from suites import run as runmod

    spec = load_spec(_write(tmp_path, GOOD, "sweep"))
    monkeypatch.setattr(runmod, "run_inline", lambda todo, run_, ctx: [
        store.append_row(run_.rows, dict(empty_row(), cell_id=c.cell_id, label=c.label,
                                         status="ok", time_s=1.0, seq_len=c.seq_len,
                                         world=c.world, git_commit="abcdef0123",
                                         git_dirty=False, hostname="elsewhere"))
        for c in todo])
    buf = io.StringIO()
    first = runmod.run_sweep(spec, out=tmp_path / "out", stream=buf).run_dir
    assert "nothing to run" not in buf.getvalue()
    buf = io.StringIO()
    runmod.run_sweep(spec, out=tmp_path / "out", stream=buf)
    assert (f"nothing to run: every cell has a row in run {first.name} (from abcdef01 on "
            "elsewhere); the table below is that run's, and --new measures every cell again"
            ) in buf.getvalue()


def test_a_terminal_gets_a_progress_bar_over_cells(tmp_path):
    """On a terminal the run shows a tqdm bar over its cells, with each finished cell and its
    outcome; rows of cells that are not this run's do not move it."""
    from results.store import append_row
    from suites.run import _Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    cells = expand(load_spec("smoke"))[:3]
    rows, out = tmp_path / "rows.jsonl", Tty()
    with _Progress(rows, cells, 1, out) as progress:
        append_row(rows, {"cell_id": cells[1].cell_id, "status": "ok", "time_s": 0.0125})
        append_row(rows, {"cell_id": "another-run", "status": "ok", "time_s": 1.0})
        append_row(rows, {"cell_id": cells[2].cell_id, "status": "oom", "time_s": None,
                          "error": "CUDA out of memory"})
    text = out.getvalue()
    assert progress.count == 3
    assert re.search(r"3/3 \[\d\d:\d\d<\d\d:\d\d", text), text  # tqdm's count, elapsed<ETA
    assert "oom (CUDA out of memory)" in text
    assert "[2/3]" not in text  # not the log lines a pipe gets
    # a rows file that cannot be read (a folder in its place, a lost disk) stops no run: found
    # by a failure-injection audit, where the progress thread died with IsADirectoryError
    rows.unlink()
    rows.mkdir()
    with _Progress(rows, cells, 1, out) as progress:
        progress._poll()
    assert progress.count == 1


def test_data_parallel_is_a_train_step_methods_key_with_the_engines_choices(tmp_path):
    """A method's data_parallel reaches its cells (the engine's Trainer takes it); an attention
    method's is refused by workload, and an unknown one with the valid choices."""
    step = ('workload = "train_step"\nmodel = "tiny"\nseq_lens = [64]\nworld = 2\n'
            '[[methods]]\nname = "burst"\ndata_parallel = "{}"\n')
    spec = load_spec(_write(tmp_path, step.format("fsdp_world"), "dp"))
    assert spec.methods[0].data_parallel == "fsdp_world"
    from suites.cells import expand

    assert [c.data_parallel for c in expand(spec)] == ["fsdp_world"]
    problems = _problems(tmp_path, step.format("zero"), "dp_bad")
    assert any("data_parallel" in p and "fsdp_world" in p for p in problems), problems
    # fsdp shards over data-parallel replicas, which a cell has none of: it would run as ddp
    problems = _problems(tmp_path, step.format("fsdp"), "dp_fsdp")
    assert any("which a cell has none of" in p for p in problems), problems
    attn = ('workload = "attention"\nseq_lens = [64]\nworld = 2\n'
            '[[methods]]\nname = "burst"\ndata_parallel = "ddp"\n')
    problems = _problems(tmp_path, attn, "dp_attn")
    assert any("methods[0].data_parallel" in p and "'train_step'" in p
               for p in problems), problems


def test_run_data_parallel_flag_runs_every_method_under_it(tmp_path, capsys):
    """`burst-bench run SPEC --data-parallel fsdp_world`: every method of a train_step spec runs
    the engine with its states sharded over every GPU (rows in the sweep <name>-fsdp_world,
    cells whose ids say so); an attention spec or an unknown value is refused before
    anything runs."""
    assert cli.main(["run", "paper_main_7b", "--data-parallel", "fsdp_world", "--executor",
                     "dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path.resolve()}/paper_main_7b-fsdp_world/<run_id>/jobs" in out
    cells = expand(load_spec("paper_main_7b").with_data_parallel("fsdp_world"))
    assert {c.data_parallel for c in cells} == {"fsdp_world"} and len(cells) == 20
    assert not {c.cell_id for c in cells} & {c.cell_id for c in expand(load_spec("paper_main_7b"))}
    assert cli.main(["run", "paper_kernel_32gpu", "--data-parallel", "fsdp_world", "--executor",
                     "dry-run", "--out", str(tmp_path)]) == 2
    assert "only train_step specs run the engine" in capsys.readouterr().err
    assert cli.main(["run", "paper_main_7b", "--data-parallel", "zero3", "--executor",
                     "dry-run", "--out", str(tmp_path)]) == 2
    assert "unknown data_parallel 'zero3'; valid: ddp, fsdp_world" in capsys.readouterr().err
    # fsdp shards over data-parallel replicas, which a cell has none of: it would run as ddp
    assert cli.main(["run", "paper_main_7b", "--data-parallel", "fsdp", "--executor",
                     "dry-run", "--out", str(tmp_path)]) == 2
    assert "which a cell has none of" in capsys.readouterr().err
    # a method that names its own would run under another one than its label says
    with pytest.raises(SpecError, match="'burst, selective, fsdp_world' sets data_parallel"):
        load_spec("engine_7b").with_data_parallel("ddp")
    assert load_spec("engine_7b").with_data_parallel("fsdp_world").methods[2].data_parallel \
        == "fsdp_world"


def test_a_data_parallel_run_says_how_to_resume_it(tmp_path, capsys):
    """A run made with --data-parallel records it: `show` on an unfinished run gives the
    command that resumes that run, flag included (without it the spec's own sweep would run
    again, under the same run id)."""
    spec = load_spec("paper_main_7b").with_data_parallel("fsdp_world")
    run_dir = tmp_path / spec.name / "r1"
    run_dir.mkdir(parents=True)
    cells = expand(spec)
    store.write_meta(run_dir, {"sweep": spec.name, "run_id": "r1", "source": spec.source,
                               "source_args": list(spec.source_args),
                               "cells": [c.cell_id for c in cells]})
    c = cells[0]
    store.append_row(run_dir / store.ROWS, dict(
        empty_row(), cell_id=c.cell_id, label=c.label, status="ok", time_s=1.0,
        tokens_per_s=1.0, sweep=c.sweep, method=c.method, seq_len=c.seq_len, world=c.world,
        workload=c.workload, model=c.model, checkpointing=c.checkpointing))
    cli.main(["show", str(run_dir)])
    out = capsys.readouterr().out
    assert (f"burst-bench run {spec.source} --data-parallel fsdp_world --out {tmp_path} "
            "--run-id r1") in out, out


def test_dry_run_with_a_hardware_profile_prices_each_cell_as_a_run_measures_it(tmp_path, capsys):
    """--hardware: the simulator's time and memory under each cell, priced as this project's
    code runs it (no paper system), the cells predicted OOM counted, and calls that would
    outlast the time limit flagged. paper_main_14b as shipped keeps the engine's states whole
    on every rank: every cell is predicted OOM, which the plain dry run did not say."""
    from suites.hardware import load
    from suites.simulate import predict

    assert cli.main(["run", "paper_main_14b", "--executor", "dry-run", "--out", str(tmp_path),
                     "--hardware", "a800"]) == 0
    out = capsys.readouterr().out
    assert out.count("simulated on a800: OOM (predicted OOM: ") == 18
    assert "# 18 of these cells are predicted out of memory on a800" in out

    spec = load_spec("paper_main_14b").with_data_parallel("fsdp_world")
    cells = expand(spec)
    cell = next(c for c in cells if c.fused_head)  # Burst-Ring: fits
    p = predict(dataclasses.replace(cell, paper=None), load("a800"))
    assert p.status == "ok"
    assert cli.main(["run", "paper_main_14b", "--executor", "dry-run", "--out", str(tmp_path),
                     "--hardware", "a800", "--data-parallel", "fsdp_world", "--time", "25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"#   [{cell.cell_id}] {cell.describe()}")
    # every step measure() runs: the warmup, one instrumented, the timed repeats (it counted
    # warmup + repeats, 4 of the 5 steps a run makes: 20% short near the limit)
    n = cell.warmup + 1 + cell.repeats
    assert n == 5 and not cell.compute_error
    assert lines[at + 1] == (f"#       simulated on a800: {p.time_s:.3g} s per step, "
                             f"{n} calls {n * p.time_s / 60:.1f} min; "
                             f"{p.memory.reserved_gib:.1f} GiB reserved")
    over = [lines[i - 1] for i, x in enumerate(lines) if "over the 25-minute limit" in x]
    assert over and all("w/o sele-ckpt" in cell or "2097152" in cell for cell in over)
    # this engine's plain head holds 12 bytes a logit: with the 14B's 120K vocabulary at 32K
    # tokens per GPU that is 44 GiB, so the selective cells without a fused head run out
    # (Megatron's and LoongTrain's; Deepspeed-Ulysses' cannot run: its degree divides no heads)
    oom = {lines[i - 1] for i, x in enumerate(lines) if "OOM (predicted OOM" in x}
    plain = {f"#   [{c.cell_id}] {c.describe()}" for c in cells
             if not c.fused_head and c.checkpointing == "selective"
             and not c.label.startswith("Deepspeed")}
    assert oom == plain and len(plain) == 6, (oom, plain)
    assert "# 6 of these cells are predicted out of memory on a800" in "\n".join(lines)


def test_a_hardware_profile_is_refused_where_cells_are_measured(tmp_path, capsys):
    assert cli.main(["run", "smoke", "--out", str(tmp_path), "--hardware", "a800"]) == 2
    assert "prices a dry run's cells" in capsys.readouterr().err
    assert not (tmp_path / "smoke").exists()
    # a dry run of CPU cells says once that it does not price them
    assert cli.main(["run", "smoke", "--out", str(tmp_path), "--executor", "dry-run",
                     "--hardware", "a800"]) == 0
    out = capsys.readouterr().out
    assert "# 30 of these cells run on CPUs: not simulated" in out and "simulated on" not in out


def test_each_shipped_gpu_sweep_leaves_its_slowest_cell_time_to_run():
    """Every GPU spec's time limit (SLURM's and the local executors') holds the calls of its
    slowest cell as the simulator prices them on the paper's A800s, with and without the
    engine's ZeRO-3 (fsdp_world): paper_main_7b's 60 minutes held 114 minutes of calls."""
    from suites.hardware import load
    from suites.simulate import predict

    hw = load("a800")
    for path in sorted((Path(__file__).parent.parent / "suites" / "specs").glob("*.toml")):
        spec = load_spec(path)
        if spec.device != "cuda":
            continue
        variants = [spec] + ([spec.with_data_parallel("fsdp_world")]
                             if spec.workload == "train_step" else [])
        for sp in variants:
            for c in expand(sp):
                p = predict(dataclasses.replace(c, paper=None), hw)
                if p.status == "ok":
                    calls_min = (c.warmup + c.repeats) * p.time_s / 60
                    assert calls_min < 0.8 * min(sp.slurm.time_min, sp.timeout_min), \
                        (sp.name, c.label, c.seq_len, calls_min)


def test_a_lock_whose_file_was_removed_meanwhile_is_not_held(tmp_path, monkeypatch):
    """scripts/train.py removes the folder of a run it refused, lock file included, while it
    holds the lock: a run that had opened the file just before got the lock of a removed file
    once it was released, and a third run then locked the new file too (a diff review)."""
    run = tmp_path / "run"
    a = store.RunLock(run).__enter__()
    stale = os.open(run / ".lock", os.O_WRONLY)  # b opens the file a holds
    (run / ".lock").unlink()  # a removes it, still holding it, then lets go
    a.__exit__(None, None, None)
    real, calls = os.open, []

    def b_opens(path, *args):
        calls.append(path)
        return stale if len(calls) == 1 else real(path, *args)

    monkeypatch.setattr(store.os, "open", b_opens)
    b = store.RunLock(run).__enter__()  # the stale file first, then the one there now
    monkeypatch.setattr(store.os, "open", real)
    assert len(calls) == 2 and (run / ".lock").exists()
    with pytest.raises(store.RunLockedError):
        store.RunLock(run).__enter__()
    b.__exit__(None, None, None)


def test_a_row_counts_the_devices_of_every_node():
    """device_count is the world, not one node's GPUs (a 2 x 4 cell said 4: a mutation audit)."""
    import dataclasses

    from suites.rows import RunContext, make_row
    from suites.simulate import as_cell

    cell = dataclasses.replace(as_cell(dict(method="ring", seq_len=64, world=8, heads=8,
                                            head_dim=8)), nodes=2, ranks_per_node=4)
    row = make_row(cell, {"status": "ok"}, RunContext("r", "inline", "{}", None, None), host={})
    assert (row["world"], row["nodes"], row["ranks_per_node"], row["device_count"]) == (8, 2, 4, 8)


# ---------------------------------------------------------------------------------------------
# results/: each of these slips passed every test while it changed what a user reads (found by
# a mutation audit)

def _cell_row(cell: str, status: str, **kw) -> dict:
    r = empty_row()
    r.update(cell_id=cell, status=status, label="burst", workload="attention", seq_len=1024,
             world=2, **kw)
    return r


def test_a_runs_table_takes_each_cells_last_row(tmp_path):
    """A cell retried after an error shows its ok row, not the first one."""
    store.append_row(tmp_path / "rows.jsonl", _cell_row("c1", "error", error="boom"))
    store.append_row(tmp_path / "rows.jsonl", _cell_row("c1", "ok", time_s=0.5))
    assert store.load(tmp_path)[["status", "time_s"]].to_dict("records") == [
        {"status": "ok", "time_s": 0.5}]


def test_the_latest_run_without_a_creation_date_is_the_newest_folder(tmp_path):
    for name, t in (("zz-old", 1000), ("aa-new", 2000)):  # names sort the other way
        (tmp_path / name).mkdir()
        store.append_row(tmp_path / name / "rows.jsonl", _cell_row("c", "ok"))
        os.utime(tmp_path / name, (t, t))
    assert store.latest_run(tmp_path).name == "aa-new"


def test_a_sweeps_newest_run_with_a_broken_table_is_refused_not_skipped(tmp_path):
    """An older run's rows were shown in its place, without a word."""
    for name, created in (("r1", "2020-01-01"), ("r2", "2021-01-01")):
        (tmp_path / name).mkdir()
        store.write_meta(tmp_path / name, {"created": created})
        store.append_row(tmp_path / name / "rows.jsonl", _cell_row("c", "ok", time_s=1.0))
    rows = tmp_path / "r2" / "rows.jsonl"
    rows.write_bytes(b"garbage\n" + rows.read_bytes())
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        store.load(tmp_path)


def test_retry_failed_runs_timed_out_cells_again():
    from suites.run import _done

    assert _done([{"cell_id": "t", "status": "timeout"}], retry_failed=True) == set()
    assert _done([{"cell_id": "t", "status": "timeout"}], retry_failed=False) == {"t"}


def test_bytes_sent_and_spread_in_the_tables():
    """bytes_sent is forward + backward; compare's spread is (max - min) / median."""
    import pandas as pd

    df = pd.DataFrame([_cell_row("a", "ok", time_s=1.0, time_s_min=0.8, time_s_max=1.6,
                                 bytes_sent_forward=2**20, bytes_sent_backward=3 * 2**20)])
    assert summary(df, "bytes_sent").iloc[0]["burst"].startswith("4.00")
    assert compare(df, df, "time_s")["spread_a"].iloc[0] == pytest.approx(0.8)


def test_published_training_rows_name_their_nodes_mfu_and_missing_rates():
    """The paper's rows: 8 GPUs a node (nodes is a key cells match on), the hardware MFU of a
    row without selective checkpointing counts its recomputation, and an OOM cell has no
    rate (0 tokens/s was written)."""
    from results.paper import main_rows

    rows = main_rows()
    assert all(r["nodes"] == r["world"] // 8 for r in rows)
    assert all(r["tokens_per_s"] is None for r in rows if r["status"] != "ok")

    def ratio(label):
        (r,) = [r for r in rows if r["model"] == "7b" and r["world"] == 32
                and r["label"] == label]
        return r["mfu_hardware_flops"] / r["mfu_model_flops_causal"]

    assert ratio("LoongTrain-USP w/o sele-ckpt") > 1.2 * ratio("LoongTrain-USP")


def test_a_kernel_backend_and_a_label_are_checked_before_anything_runs(tmp_path):
    """Found by a harness fuzz: backend = "bogus", or a CUDA kernel in a CPU sweep, passed the
    spec (and a dry run), then every cell failed at run time; a label with a newline split the
    progress line and every table."""
    text = (GOOD.replace("[shape]", 'device = "cpu"\n[shape]')
            + '[[methods]]\nname = "ring"\nlabel = "bogus"\noptions = { backend = "bogus" }\n'
            + '[[methods]]\nname = "allgather"\noptions = { backend = "cuda_sdpa" }\n'
            + '[[methods]]\nname = "ulysses"\nlabel = "two\\nlines"\n')
    with pytest.raises(SpecError) as ei:
        load_spec(_write(tmp_path, text))
    probs = "\n".join(ei.value.problems)
    for part in ("unknown kernel backend 'bogus'", "'cuda_sdpa' needs CUDA tensors, got device cpu",
                 "'two\\nlines' has a control character"):
        assert part in probs, (part, probs)
    ok = text.replace('"bogus" }', '"torch" }').replace('"cuda_sdpa" }', '"cpu_flash" }')
    assert load_spec(_write(tmp_path, ok.replace("two\\nlines", "two lines"), "ok"))


def test_sizes_beyond_int64_are_refused_by_name(tmp_path):
    """A seq_len of 2**70 passed the spec and crashed the masks' numpy (a traceback from
    simulate, a one-character reason from run); every size has a bound now."""
    text = ('workload = "attention"\nworld = 2\nseq_lens = [%d]\n[shape]\nheads = %d\n'
            '[[methods]]\nname = "burst"\n')
    for lens, heads, where, match in ((2**70, 2, "seq_lens", "integers >= 1 and <= 1099511627776"),
                                      (64, 2**17, "shape.heads", "must be <= 65536")):
        with pytest.raises(SpecError) as ei:
            load_spec(_write(tmp_path, text % (lens, heads)))
        assert any(line.startswith(where) and match in line for line in ei.value.problems), \
            ei.value.problems
    with pytest.raises(SpecError, match="world: 2097152 must be <= 1048576"):
        load_spec(_write(tmp_path, text.replace("world = 2", "world = 2097152") % (64, 2)))


def test_a_progress_line_quotes_the_message_not_a_cpp_backtrace():
    """torch's C++ errors end with a backtrace; the progress line quoted its last line (a
    lone quote: 'error (")')."""
    from suites.run import short_reason

    text = ("RuntimeError: value cannot be converted to type int64_t without overflow\n"
            "Exception raised from checked_convert at c10/util/TypeCast.h:12 (most recent "
            "call first):\nframe #0: c10::Error::Error() + 0x9a\nframe #1: f + 0x1\n\"\n")
    assert short_reason(text) == ("RuntimeError: value cannot be converted to type int64_t "
                                  "without overflow")
    assert short_reason("ValueError: bad\n\"") == "ValueError: bad"


def test_one_mistake_in_a_spec_is_reported_once(tmp_path):
    """A fuzz of the CLI: one mistake was reported more than once. A misspelt paper method
    also said that its entry's name was required and that the baseline (its label) was no
    method's; a float16 dtype or an unknown data_parallel was said again for every method
    whose cells have it."""
    main7b = (SPEC_DIR / "paper_main_7b.toml").read_text()
    paper = ("'loongtrain_uspp' is not valid (did you mean 'loongtrain_usp'?); valid: "
             "megatron_cp, deepspeed_ulysses, loongtrain_double_ring, loongtrain_usp, burst, "
             "burstengine, burstengine_usp")
    assert _problems(tmp_path, main7b.replace('"loongtrain_usp"', '"loongtrain_uspp"'),
                     "p") == [f"methods[3].paper: {paper}", f"methods[7].paper: {paper}"]
    engine = (SPEC_DIR / "engine_7b.toml").read_text()
    assert _problems(tmp_path, engine.replace('dtype = "bfloat16"', 'dtype = "float16"'),
                     "f") == ["dtype: the engine trains in float32, float64, bfloat16, not "
                              "float16 (float16 would need loss scaling)"]
    import torch

    from burst.engine.trainer import Trainer

    with pytest.raises(ValueError, match=r"^Trainer: dtype: the engine trains in float32, "
                       r"float64, bfloat16, not float16 \(float16 would need loss scaling\)$"):
        Trainer("tiny", dtype=torch.float16)  # the one wording, the engine's
    assert _problems(tmp_path, engine.replace('data_parallel = "fsdp_world"',
                                              'data_parallel = "zero9"'), "d") == [
        "methods[2].data_parallel: unknown data_parallel 'zero9'; valid: ddp, fsdp_world"]
