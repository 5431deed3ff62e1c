"""Mutation check of the test suite: each bug in ``tests/mutants.json`` is planted, one at a
time, in a copy of this checkout, and the tests named beside it must then fail.

Each entry is a small, realistic mistake (an accumulator in the wrong dtype, a dropped term, a
wrong rank, a wrong unit) that once passed every test while it changed a number a user sees;
the tests that now catch it were written for it. A mutant that survives means a test lost its
edge. The copy is a temporary folder (the checkout's tracked and unignored files, as they are
now); this checkout is never edited.

    .venv/bin/python scripts/check_mutants.py                  # every mutant, ~36 min on 2 cores
    .venv/bin/python scripts/check_mutants.py --only figures-  # the ids that start so
    .venv/bin/python scripts/check_mutants.py --list

Exit 0: every mutant caught; 1: some survived (named); 2: an entry no longer applies (its text
is not exactly once in its file: update the catalogue with the code).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests" / "mutants.json"


def load(only: list[str] | None = None) -> list[dict]:
    entries = json.loads(CATALOGUE.read_text())
    return [e for e in entries if not only or any(e["id"].startswith(p) for p in only)]


def stale(entries: list[dict], root: Path = ROOT) -> list[str]:
    """Entries whose text is not exactly once in their file."""
    out = []
    for e in entries:
        n = (root / e["file"]).read_text().count(e["old"])
        if n != 1:
            out.append(f"{e['id']}: its text is {n} times in {e['file']}, not once")
    return out


def _copy(dest: Path) -> None:
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run(entries: list[dict]) -> list[str]:
    survived = []
    with tempfile.TemporaryDirectory(prefix="burst-mutants-", dir=ROOT.parent) as tmp:
        copy = Path(tmp)
        _copy(copy)
        env = dict(os.environ, PYTHONPATH=str(copy))
        for i, e in enumerate(entries, 1):
            path = copy / e["file"]
            clean = path.read_text()
            path.write_text(clean.replace(e["old"], e["new"]))
            start = time.perf_counter()
            try:
                res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q",
                                      "-p", "no:cacheprovider", *e["tests"]],
                                     cwd=copy, env=env, capture_output=True, text=True)
            finally:
                path.write_text(clean)
            last = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
            caught = res.returncode == 1  # tests failed (not: no tests, an error of pytest)
            if not caught:
                survived.append(f"{e['id']} ({e['why']}): pytest exit {res.returncode}, {last}")
            print(f"[{i}/{len(entries)}] {e['id']}: {'caught' if caught else 'SURVIVED'} "
                  f"({time.perf_counter() - start:.0f} s; {last})", flush=True)
    return survived


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="PREFIX", help="mutant ids starting so")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args(argv)
    entries = load(args.only)
    if not entries:
        ap.error(f"no mutant id starts with {' or '.join(args.only)}")
    if args.list:
        for e in entries:
            print(f"{e['id']:32s} {e['file']}: {e['why']}")
        return 0
    problems = stale(entries)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    survived = run(entries)
    print(f"{len(entries) - len(survived)} of {len(entries)} mutants caught")
    if survived:
        print("survived (a test that can no longer fail for this bug):\n  "
              + "\n  ".join(survived), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
