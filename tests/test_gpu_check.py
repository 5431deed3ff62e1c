"""scripts/gpu_check.py checks itself on CPU (issue 8): the whole flow at tiny sizes (--dry-run)
writes schema rows for every section, JSONL and CSV agree, and the table is printed; without a
GPU and without --dry-run it says so in one line and exits 0."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from results.schema import COLUMNS, STATUSES

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of GPU-less machines")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA device" in out[0]
    assert not (tmp_path / "x").exists()


def test_dry_run_writes_rows_for_every_section(tmp_path):
    out = tmp_path / "gpu"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    with open(out / "rows.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(rows) == len(table) > 10
    assert list(table[0]) == list(COLUMNS)
    for r in rows:
        assert set(r) == set(COLUMNS)
        assert r["status"] in STATUSES, r
        assert r["status"] != "error", r["error"]
        assert r["source"] == "measured" and r["sweep"] == "gpu_check" and r["date"]
    by = {}
    for r in rows:
        by.setdefault(r["workload"], []).append(r)
    assert {"gpu_tests", "kernel", "ring_emulation", "train_step", "max_seq"} <= set(by)
    # the GPU tests ran through pytest and were skipped with the reason (no CUDA in a dry run)
    tests = [r for r in by["gpu_tests"] if r["method"] == "pytest"]
    assert tests and all(r["status"] == "skipped" and "CUDA" in r["error"] for r in tests)
    summary = [r for r in by["gpu_tests"] if "summary" in r["label"]]
    assert summary and summary[0]["status"] == "ok"
    # measured sections: real numbers under the schema's columns
    ours = [r for r in by["kernel"] if r["method"] == "burst.kernel" and r["status"] == "ok"]
    assert ours and all(r["time_s"] > 0 and r["attn_tflops"] > 0 for r in ours)
    assert all(r["speedup"] is not None for r in ours)  # against torch SDPA
    assert any(r["status"] == "ok" for r in by["ring_emulation"])
    steps = [r for r in by["train_step"] if r["status"] == "ok"]
    assert steps and all(r["tokens_per_s"] > 0 and r["tflops_model_flops_causal"] > 0
                         for r in steps)
    assert {r["checkpointing"] for r in by["train_step"]} >= {"none", "full"}
    assert "workload" in res.stdout.splitlines()[-len(rows) - 2]  # the table comes last
