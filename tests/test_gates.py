"""Deterministic performance gates (issue 7): bytes, kept activations, FLOPs and simulator
predictions must equal the stored values in suites/gates_expected.json. A change that moves
them must update that file on purpose (``python -m suites.gates --update``); the failure shows
by how much each value moved."""

from __future__ import annotations

import pytest

from suites import gates


@pytest.fixture(scope="module")
def values():
    return gates.collect()


def test_gate_values_equal_the_stored_ones(values):
    expected = gates.load_expected()
    assert expected, f"no stored gate values at {gates.EXPECTED}"
    diff = gates.compare(expected, values)
    assert not diff, ("performance gates moved (run `python -m suites.gates --update` if on "
                      "purpose):\n" + gates.format_diff(diff))


def test_gates_cover_every_family(values):
    prefixes = {k.split(".")[0] for k in values}
    assert prefixes == {"bytes", "kept", "flops", "sim"}
    methods = {k.split(".")[1] for k in values if k.startswith("bytes.")}
    assert {"burst", "ring", "zigzag_ring", "striped_ring", "allgather", "ulysses", "usp",
            "double_ring"} <= methods


def test_compare_reports_a_moved_value():
    diff = gates.compare({"a": 100, "b": 1.0, "c": "ok"}, {"a": 110, "b": 1.0, "d": 3})
    assert [d[0] for d in diff] == ["a", "c", "d"]
    assert "+10%" in gates.format_diff(diff)
    # full values stay apart and a tiny move still shows (they ran together as "...948173...")
    text = gates.format_diff([("t", 173.89891143490948, 173.89920405456562)])
    assert " 173.89891143490948 " in text and "+0.000168%" in text
    # the gates are exact to rounding: a move of one in a million is a move
    assert gates.compare({"a": 100.0}, {"a": 100.0001}) and not gates.compare(
        {"a": 100.0}, {"a": 100.0 * (1 + 1e-12)})


def test_the_command_fails_when_a_gate_moved(monkeypatch, tmp_path, capsys):
    """`python -m suites.gates` (make gates) exits 1 when a value differs, 0 when none does."""
    expected = tmp_path / "expected.json"
    expected.write_text('{"flops.x": 1, "sim.y": 2.5}')
    monkeypatch.setattr(gates, "collect", lambda: {"flops.x": 1, "sim.y": 2.5})
    assert gates.main(["--expected", str(expected)]) == 0
    monkeypatch.setattr(gates, "collect", lambda: {"flops.x": 2, "sim.y": 2.5})
    assert gates.main(["--expected", str(expected)]) == 1
    assert "1 differ from" in capsys.readouterr().out


def test_selective_half_keeps_half_the_cache_of_selective(values):
    half = values["kept.selective_half.fused.cache"]
    full = values["kept.selective.fused.cache"]
    assert full > 0 and half * 2 == full


def test_a_missing_expected_file_is_named_not_diffed(tmp_path, capsys):
    """A misspelled --expected printed every gate as moved; it is refused before collecting."""
    with pytest.raises(SystemExit) as e:
        gates.main(["--expected", str(tmp_path / "gates_expectd.json")])
    assert e.value.code == 2 and "no such file" in capsys.readouterr().err


def test_two_simulated_cells_may_not_share_a_gate(monkeypatch):
    """A gate key names a cell by label, world, length and checkpointing; a spec with two cells
    under one key would let the second overwrite the first's gate, so it is refused."""
    import suites.simulate

    row = dict(label="Burst-Ring", method="burst", world=32, seq_len=1 << 20,
               checkpointing="selective", status="ok", tokens_per_s=100.0)
    monkeypatch.setattr(gates, "SIM_SPECS", ("one_spec",))
    monkeypatch.setattr(suites.simulate, "simulate_spec",
                        lambda spec, hw: [row, dict(row, tokens_per_s=90.0)])
    with pytest.raises(ValueError, match="names two cells of one_spec"):
        gates._simulated()
    monkeypatch.setattr(suites.simulate, "simulate_spec",
                        lambda spec, hw: [row, dict(row, checkpointing="full")])
    assert len(gates._simulated()) == 4  # status and tokens/s of each
