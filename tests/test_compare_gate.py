"""The regression gate of ``burst-bench compare`` (issue 7): a synthetic 10% slowdown of a real
result set fails a 5% threshold, a 1% one passes, and a cell that stops succeeding fails."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from suites.cli import main

SMOKE = sorted(Path(__file__).resolve().parent.parent.glob("results/smoke/*/table.csv"))


@pytest.fixture(scope="module")
def baseline() -> pd.DataFrame:
    assert SMOKE, "the committed smoke results (results/smoke/*/table.csv) are missing"
    df = pd.read_csv(SMOKE[-1])
    return df[df["status"] == "ok"].reset_index(drop=True)


def _slowed(df: pd.DataFrame, factor: float) -> pd.DataFrame:
    out = df.copy()
    for col in ("time_s", "time_s_min", "time_s_max"):
        out[col] = out[col] * factor
    return out


@pytest.mark.parametrize(("factor", "code"), [(1.10, 1), (1.01, 0), (0.90, 0)])
def test_threshold_on_a_uniform_slowdown(tmp_path, baseline, factor, code, capsys):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    _slowed(baseline, factor).to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--fail-above", "5"]) == code
    out = capsys.readouterr().out
    assert "spread a" in out  # the spread of each side is shown next to the ratio
    if code:
        assert f"{len(baseline)} cell(s) regressed by more than 5%" in out


def test_a_cell_that_stops_succeeding_fails(tmp_path, baseline):
    broken = baseline.copy()
    broken.loc[0, "status"] = "oom"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    broken.to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--fail-above", "5"]) == 1
    assert main(["compare", str(a), str(b)]) == 0  # without a threshold it only reports
