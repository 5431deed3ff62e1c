# The two Quickstart commands (README) and what CI runs (.ci/run -> make test).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint gpu-check clean

# torch==2.13.0 comes from the `ci` extra: an open torch range pulls a multi-GB CUDA build.
$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[ci,dev]'
	touch $@

setup: $(BIN)/.installed

# the smoke sweep (suites/specs/smoke.toml): every method on 4 local CPU ranks; --new measures
# afresh instead of resuming the latest run; rows and tables go to results/smoke/<run-id>/
demo: setup
	$(BIN)/burst-bench run suites/specs/smoke.toml --new

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
