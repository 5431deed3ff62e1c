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


# 5.2% slower is over a 5% threshold (b/a = 1.052, speedup 0.9506 < 1/1.05); 4.8% is not
@pytest.mark.parametrize(("factor", "code"), [(1.10, 1), (1.052, 1), (1.048, 0), (1.01, 0),
                                              (0.90, 0)])
def test_threshold_on_a_uniform_slowdown(tmp_path, baseline, factor, code, capsys):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    _slowed(baseline, factor).to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--fail-above", "5"]) == code
    out = capsys.readouterr().out
    assert "spread a" in out  # the spread of each side is shown next to the ratio
    assert "time_s (ms) a" in out and "ratio b/a" in out  # the values are ms, headed so
    if code:
        assert f"{len(baseline)} cell(s) regressed by more than 5%" in out


def test_a_cell_that_stops_succeeding_fails(tmp_path, baseline, capsys):
    broken = baseline.copy()
    broken.loc[0, "status"] = "error"  # a 'wrong results' row keeps its (fast) time
    broken.loc[0, "time_s"] = baseline.loc[0, "time_s"] / 2
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    broken.to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--fail-above", "5"]) == 1
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0  # without a threshold it only reports
    first = capsys.readouterr().out.splitlines()[3]  # title, header, rule, the broken cell
    # its status stands where its time would read as a 2x improvement
    assert " error " in f" {first} " and f"{baseline.loc[0, 'time_s'] * 500:.3g}" not in first


def test_a_cell_missing_from_b_fails(tmp_path, baseline, capsys):
    """A cell that vanished (its job never wrote a row) must not pass the gate."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    baseline.iloc[1:].to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--fail-above", "5"]) == 1
    assert "missing" in capsys.readouterr().out


def test_rates_are_better_when_higher(tmp_path, baseline, capsys):
    faster = baseline.copy()
    faster["tokens_per_s"] = faster["tokens_per_s"] * 2
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    faster.to_csv(b, index=False)
    out_csv = tmp_path / "cmp.csv"
    assert main(["compare", str(a), str(b), "--metric", "tokens_per_s", "--fail-above", "5",
                 "--out", str(out_csv)]) == 0
    assert pd.read_csv(out_csv)["speedup"].tolist() == pytest.approx([2.0] * len(baseline))
    assert main(["compare", str(b), str(a), "--metric", "tokens_per_s", "--fail-above",
                 "5"]) == 1


def test_a_gate_without_values_fails_instead_of_passing(tmp_path, baseline, capsys):
    """b lost the metric (ok rows without it) or no cell has it: both passed the gate before."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    lost = baseline.copy()
    lost.loc[0, "time_s"] = float("nan")
    lost.to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--fail-above", "5"]) == 1
    assert "1 cell(s) regressed" in capsys.readouterr().out
    # a metric neither side has (GPU memory of CPU runs): nothing compared is an error
    baseline.assign(mem_reserved_bytes=float("nan")).to_csv(a, index=False)
    baseline.assign(mem_reserved_bytes=float("nan")).to_csv(b, index=False)
    assert main(["compare", str(a), str(b), "--metric", "mem_reserved_bytes",
                 "--fail-above", "5"]) == 2
    assert "nothing to compare" in capsys.readouterr().err


def test_a_value_that_falls_to_zero_or_rises_from_it_is_compared(tmp_path, baseline, capsys):
    """A rate that fell to 0 got no speedup and passed the gate, as did bytes that rose from 0
    (a zero was taken for a missing value: a harness audit). 0 -> 0 is equal."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    baseline.to_csv(a, index=False)
    for metric, frm, to, code in (("tokens_per_s", None, 0.0, 1),  # a rate fell to 0
                                  ("bytes_sent_backward", 0.0, None, 1),  # bytes rose from 0
                                  ("bytes_sent_backward", None, 0.0, 0),  # bytes fell to 0
                                  ("bytes_sent_backward", 0.0, 0.0, 0)):  # unchanged at 0
        one, two = baseline.copy(), baseline.copy()
        if frm is not None:
            one.loc[0, metric] = frm
        if to is not None:
            two.loc[0, metric] = to
        one.to_csv(a, index=False)
        two.to_csv(b, index=False)
        assert main(["compare", str(a), str(b), "--metric", metric, "--fail-above", "5"]) == \
            code, (metric, frm, to)
        out = capsys.readouterr().out
        assert ("1 cell(s) regressed" in out) == bool(code), out
