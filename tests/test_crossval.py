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
    with pytest.raises(ValueError, match="by='rows'"):
        crossval.folds(evals, "rows")


def _shipped_fit(seen):
    """A stand-in for calibrate._fit_group: records the cells it is given, fits nothing."""
    def fit(hw, impls, cells, *args):
        seen.append(list(cells))
        return hw, impls
    return fit


def test_each_fold_fits_without_the_rows_it_predicts(evals, monkeypatch):
    seen = []
    monkeypatch.setattr(calibrate, "_fit_group", _shipped_fit(seen))
    cells = calibrate.paper_cells()
    for by in crossval.BY:
        for name, held in crossval.folds(evals, by):
            seen.clear()
            got = crossval._fold((HW.name, by, name, held))
            (train,) = seen
            assert len(train) == len(cells) - len(held)
            assert not any(cells[i][0] == r for i in held for r, _ in train)  # paper rows
            assert {crossval._key(r) for r in got} == {crossval._key(evals[i]) for i in held}
            assert all(r["by"] == by and r["fold"] == name for r in got)
            if by == "row":
                break  # one row fold suffices here; the partition test covers the rest


def test_crossval_puts_each_prediction_next_to_the_fit(evals, monkeypatch, capsys, tmp_path):
    """With a fit that returns the shipped constants, every out-of-sample prediction equals the
    in-sample one: the rows are matched to their own fit and published values; the kept file
    reads back as written."""
    monkeypatch.setattr(calibrate, "_fit_group", _shipped_fit([]))
    rows = crossval.crossval(evals, HW.name, by=("panel",), jobs=1)
    assert len(rows) == 38
    for r in rows:
        assert r["simulated_cv"] == pytest.approx(r["simulated_fit"])
        assert r["rel_error_cv"] == pytest.approx(r["rel_error_fit"])
    assert "[8/8]" in capsys.readouterr().err  # progress, fold by fold
    path = tmp_path / "cv.csv"
    crossval.write(rows, path)
    back = crossval.read(path)
    assert [crossval._key(r) for r in back] == [crossval._key(r) for r in rows]
    s = crossval.summarise(back)["panel"]
    assert s["panels"] == 8 and s["panels_ranking_preserved"] == 5  # as in sample
    assert s["median_cv"] == pytest.approx(s["median_fit"], rel=1e-4)


def test_kept_crossval_is_of_the_shipped_model_and_in_the_docs(evals):
    """results/simulator_crossval.csv was computed on the model and constants shipped (rerun
    ``python -m suites.calibrate --crossval`` after a change that moves a prediction), covers
    every row both ways, and docs/simulator.md and the README report it."""
    from suites.simulator_doc import _crossval_section, crossval_line

    kept = crossval.read()
    assert crossval.stale_rows(kept, evals) == []
    s = crossval.summarise(kept)
    assert s["row"]["rows"] == s["panel"]["rows"] == 38
    # out of sample no row may come out better on the median than in sample by chance alone
    assert s["row"]["median_cv"] >= s["row"]["median_fit"] - 1e-9
    doc = calibrate.DOC.read_text()
    for line in _crossval_section(evals):
        assert line in doc, line
    assert crossval_line(evals) in (calibrate.REPO / "README.md").read_text()


def test_a_changed_model_makes_the_kept_crossval_stale(evals):
    kept = crossval.read()
    moved = copy.deepcopy(evals)
    i = min(_timed(evals))
    moved[i]["simulated"] *= 1.01
    stale = crossval.stale_rows(kept, moved)
    assert len(stale) == 2 and all(evals[i]["label"] in x for x in stale)  # row and panel
    assert crossval.stale_rows([r for r in kept if r["by"] == "row"], evals)  # panel missing
