"""The mutation catalogue (tests/mutants.json, run by scripts/check_mutants.py) stays in step
with the code: each planted bug's text is exactly once in its file, and its tests exist. The
planting itself takes minutes and is not run here (`make mutants`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("check_mutants",
                                                  ROOT / "scripts" / "check_mutants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_mutant_still_applies_and_names_its_tests():
    mod = _script()
    entries = mod.load()
    assert len(entries) >= 50
    assert len({e["id"] for e in entries}) == len(entries)
    assert mod.stale(entries) == []
    for e in entries:
        assert e["old"] != e["new"] and e["why"], e["id"]
        assert (ROOT / e["tests"][0]).is_file(), e["id"]
        assert e["tests"][0].startswith("tests/test_"), e["id"]


def test_a_stale_entry_is_named(tmp_path):
    mod = _script()
    (tmp_path / "f.py").write_text("x = 1\nx = 1\n")
    entry = dict(id="m", file="f.py", old="x = 1", new="x = 2", tests=[], why="")
    assert mod.stale([entry], tmp_path) == ["m: its text is 2 times in f.py, not once"]
    assert mod.stale([dict(entry, old="y")], tmp_path) == ["m: its text is 0 times in f.py, "
                                                           "not once"]
