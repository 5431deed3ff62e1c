"""The simulator fit's cross-validation (suites/crossval.py): every fold leaves out what it
predicts, the kept result is the cross-validation of the shipped model, and the docs report it.

The refits themselves (46 of about 20 s) are left to ``python -m suites.calibrate --crossval``;
here the fit is replaced where a test only needs to see what it was given."""

from __future__ import annotations

import copy

import pytest

from suites import calibrate, crossval
from suites import hardware as hwmod
from suites.implementations import implementations

HW = hwmod.load(calibrate.PAPER_PROFILE)


@pytest.fixture(scope="module")
def evals():
    return calibrate.evaluate(HW, implementations())


def _timed(evals):
    return {i for i, e in enumerate(evals) if e["published"] and e["status_paper"] == "ok"}


def test_folds_partition_the_rows_with_a_number(evals):
    rows = crossval.folds(evals, "row")
    assert [held for _, held in rows] == [[i] for i in sorted(_timed(evals))]
    assert len(rows) == 38 and len({name for name, _ in rows}) == 38
    panels = crossval.folds(evals, "panel")
    assert len(panels) == 8
    flat = [i for _, held in panels for i in held]
    assert sorted(flat) == sorted(_timed(evals))  # each row in exactly one panel
    for name, held in panels:
        assert {calibrate.panel_name(evals[i]) for i in held} == {name}
    # the memory folds: the training cells the memory fit weighs (published as run or OOM,
    # not the 3 that Deepspeed-Ulysses' code cannot run)
    weighed = {i for i, e in enumerate(evals) if e["table"] == "main"
               and e["status_paper"] in ("ok", "oom") and e["status_sim"] != "skipped"}
    assert len(weighed) == 36
    cells = crossval.folds(evals, "memory_row")
    assert sorted(i for _, held in cells for i in held) == sorted(weighed)
    assert all(len(held) == 1 for _, held in cells)
    panels = crossval.folds(evals, "memory_panel")
    assert [name for name, _ in panels] == ["main 7b 32", "main 7b 64", "main 14b 32",
                                            "main 14b 64"]
    assert sorted(i for _, held in panels for i in held) == sorted(weighed)
    with pytest.raises(ValueError, match="by='rows'"):
        crossval.folds(evals, "rows")


def _shipped_fit(seen):
    """A stand-in for calibrate._fit_group and _fit_memory: records the cells it is given,
    fits nothing."""
    def fit(hw, impls, cells, *args):
        seen.append(list(cells))
        return hw, impls
    return fit


def test_each_fold_fits_without_the_rows_it_predicts(evals, monkeypatch):
    seen = []
    monkeypatch.setattr(calibrate, "_fit_group", _shipped_fit(seen))
    monkeypatch.setattr(calibrate, "_fit_memory", _shipped_fit(seen))
    cells = calibrate.paper_cells()
    for by in crossval.BY:
        for name, held in crossval.folds(evals, by):
            seen.clear()
            got = crossval._fold((HW.name, by, name, held))
            # the memory constants, then (time folds) the time constants: neither sees the rows
            assert len(seen) == (2 if by in crossval.TIME_BY else 1)
            for train in seen:
                assert len(train) == len(cells) - len(held)
                assert not any(cells[i][0] == r for i in held for r, _ in train)  # paper rows
            assert {crossval._key(r) for r in got} == {crossval._key(evals[i]) for i in held}
            assert all(r["by"] == by and r["fold"] == name for r in got)
            if by.endswith("row"):
                break  # one row fold suffices here; the partition test covers the rest


def test_crossval_puts_each_prediction_next_to_the_fit(evals, monkeypatch, capsys, tmp_path):
    """With a fit that returns the shipped constants, every out-of-sample prediction equals the
    in-sample one: the rows are matched to their own fit and published values; the kept file
    reads back as written."""
    monkeypatch.setattr(calibrate, "_fit_group", _shipped_fit([]))
    monkeypatch.setattr(calibrate, "_fit_memory", _shipped_fit([]))
    rows = crossval.crossval(evals, HW.name, by=("panel", "memory_panel"), jobs=1)
    assert len(rows) == 38 + 36
    for r in rows:
        if r["by"] == "panel":
            assert r["simulated_cv"] == pytest.approx(r["simulated_fit"])
            assert r["rel_error_cv"] == pytest.approx(r["rel_error_fit"])
        else:  # a memory fold gives no throughput of its own
            assert r["simulated_cv"] is r["rel_error_cv"] is None
        assert (r["status_cv"], r["mem_sim_cv"]) == (r["status_fit"], r["mem_sim_fit"])
    assert "[12/12]" in capsys.readouterr().err  # progress, fold by fold
    path = tmp_path / "cv.csv"
    crossval.write(rows, path)
    back = crossval.read(path)
    assert [crossval._key(r) for r in back] == [crossval._key(r) for r in rows]
    missing = crossval.stale_rows(back, evals)  # only the folds not run
    assert len(missing) == 38 + 36 and all(x.startswith(("row:", "memory_row:"))
                                           and x.endswith(" missing") for x in missing)
    s = crossval.summarise(back)
    assert s["panel"]["panels"] == 8 and s["panel"]["panels_ranking_preserved"] == 5
    assert s["panel"]["median_cv"] == pytest.approx(s["panel"]["median_fit"], rel=1e-4)
    # as in sample: calibrate --check counts 9 of 17 OOM cells OOM; 2 of the others are in the
    # kernel table, 3 cannot run; no run OOM
    m = s["memory_panel"]
    assert (m["oom_cv"], m["oom_fit"], m["oom_cells"], m["ok_cells"]) == (9, 9, 12, 24)
    assert (m["ok_oom_cv"], m["ok_oom_fit"], m["memory_rows"]) == (0, 0, 9)


def test_kept_crossval_is_of_the_shipped_model_and_in_the_docs(evals):
    """results/simulator_crossval.csv was computed on the model and constants shipped (rerun
    ``python -m suites.calibrate --crossval`` after a change that moves a prediction), covers
    every row both ways, and docs/simulator.md and the README report it."""
    from suites.simulator_doc import _crossval_section, crossval_line

    kept = crossval.read()
    assert crossval.stale_rows(kept, evals) == []
    s = crossval.summarise(kept)
    assert s["row"]["rows"] == s["panel"]["rows"] == 38
    assert s["memory_row"]["cells"] == s["memory_panel"]["cells"] == 36
    # out of sample no row may come out better on the median than in sample by chance alone
    assert s["row"]["median_cv"] >= s["row"]["median_fit"] - 1e-9
    doc = calibrate.DOC.read_text()
    for line in _crossval_section(evals):
        assert line in doc, line
    assert crossval_line(evals) in (calibrate.REPO / "README.md").read_text()


def test_kept_memory_folds_are_what_the_memory_folds_give_now(evals):
    """The memory refits take seconds, so each kept memory fold is recomputed here and compared
    column by column (the staleness check looks only at the in-sample columns): a change in
    the memory fit or in the folds themselves cannot leave an old file standing."""
    kept = [r for r in crossval.read() if r["by"] in crossval.MEMORY_BY]
    now = crossval.crossval(evals, HW.name, by=crossval.MEMORY_BY, jobs=1)
    assert len(now) == len(kept) == 72
    for a, b in zip(kept, now, strict=True):
        assert {k: a[k] for k in ("by", "fold", "status_cv", "constants_cv")} == {
            k: b[k] for k in ("by", "fold", "status_cv", "constants_cv")}
        assert crossval._key(a) == crossval._key(b)
        for k in ("mem_sim_cv", "mem_rel_error_cv"):
            # (kept with 6 decimals)
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-6) if b[k] is not None \
                else a[k] is None, (a["fold"], k)


def test_a_kept_time_fold_is_what_it_gives_now(evals):
    """One time fold rerun (a refit of about 20 s; all 46 take minutes): the kernel table's
    128K panel, the fold whose constants move most. A change to the time fit, its start or
    its folds that leaves every shipped constant as it was still fails here."""
    name, held = crossval.folds(evals, "panel")[0]
    assert name == "kernel 32 131072"
    now = crossval._fold((HW.name, "panel", name, held))
    kept = {crossval._key(r): r for r in crossval.read() if r["by"] == "panel"
            and r["fold"] == name}
    assert len(now) == len(kept) == 4
    for r in now:
        k = kept[crossval._key(r)]
        assert (k["constants_cv"], k["status_cv"]) == (r["constants_cv"], r["status_cv"])
        assert k["simulated_cv"] == pytest.approx(r["simulated_cv"], rel=1e-6)


def test_a_changed_model_makes_the_kept_crossval_stale(evals):
    kept = crossval.read()
    moved = copy.deepcopy(evals)
    i = min(_timed(evals))
    moved[i]["simulated"] *= 1.01
    stale = crossval.stale_rows(kept, moved)
    assert len(stale) == 2 and all(evals[i]["label"] in x for x in stale)  # row and panel
    assert crossval.stale_rows([r for r in kept if r["by"] == "row"], evals)  # panel missing
    j = next(j for j, e in enumerate(evals) if e["table"] == "main" and e["mem_sim_gib"])
    moved = copy.deepcopy(evals)
    moved[j]["mem_sim_gib"] *= 1.01  # memory counted otherwise (a timed row too: all four)
    assert {x.split(":")[0] for x in crossval.stale_rows(kept, moved)} == set(crossval.BY)
    moved = copy.deepcopy(evals)
    moved[j]["status_sim"] = "oom" if evals[j]["status_sim"] == "ok" else "ok"
    assert len(crossval.stale_rows(kept, moved)) >= 2
    for key, at in (("published", i), ("mem_paper_gib", j)):  # the paper's tables edited
        moved = copy.deepcopy(evals)
        moved[at][key] *= 1.1
        assert crossval.stale_rows(kept, moved), key
