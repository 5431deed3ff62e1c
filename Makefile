# The two Quickstart commands (README) and what CI runs (.ci/run -> make test).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint gpu-check clean figures calibrate bench perf-gate gates mutants

# torch==2.13.0 comes from the `ci` extra: an open torch range pulls a multi-GB CUDA build.
$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[ci,dev]'
	touch $@

setup: $(BIN)/.installed

# the smoke sweep (suites/specs/smoke.toml): every CPU-capable method on 4 local CPU ranks;
# --new measures afresh instead of resuming the latest run; rows and tables go to
# results/smoke/<run-id>/
demo: setup
	$(BIN)/burst-bench run suites/specs/smoke.toml --new

test: setup
	$(BIN)/python -m pytest

# the paper's figures: simulate the paper sweeps on the A800 profile (results/simulated/), the
# analytic breakdowns, then every figure (paper_figures/out/: PNG, PDF, CSV); measured sweeps
# already under results/ appear where they apply
PAPER_SWEEPS := paper_kernel_32gpu paper_main_7b paper_main_14b paper_ablation paper_weak_scaling \
	cpu_scaling cpu_long
figures: setup
	$(BIN)/python -m suites.simulate $(PAPER_SWEEPS) --hardware a800 --out results/simulated
	$(BIN)/python -m suites.breakdowns
	$(BIN)/python -m paper_figures

# refit the simulator on the paper's tables: results/simulator_fit.csv, docs/simulator.md and
# the README's fit table (`python -m suites.calibrate --write` also stores the constants)
calibrate: setup
	$(BIN)/python -m suites.calibrate --write

# performance regression testing (docs/regressions.md): timed micro-benchmarks saved per machine
# class, the ratio time gates, and the deterministic gates (also part of `make test`)
bench: setup
	$(BIN)/python -m pytest benchmarks --benchmark-enable --benchmark-autosave \
		--benchmark-storage=.benchmarks/$$(BENCH_THREADS=$${BENCH_THREADS:-1} $(BIN)/python -c \
		"import os, torch; torch.set_num_threads(int(os.environ['BENCH_THREADS'])); \
		from suites.timegate import machine_class as m; print(m())")/$${BENCH_DEVICE:-cpu}-x$${BENCH_SCALE:-1}

perf-gate: setup
	$(BIN)/python -m suites.timegate

gates: setup
	$(BIN)/python -m suites.gates

# the mutation check: each bug of tests/mutants.json planted in a copy, its tests must fail
# (scripts/check_mutants.py; 35-48 min on 2 cores, not part of CI)
mutants: setup
	$(BIN)/python scripts/check_mutants.py

# the one-GPU check (issue 8): GPU tests, kernel and ring efficiency, engine steps, longest fit
gpu-check:  # the GPU machine's own torch: no venv, no install (no internet there)
	bash scripts/gpu_check.sh --out results/gpu/$$(hostname -s)_$$(date -u +%Y%m%dT%H%M%SZ)

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
