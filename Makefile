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

demo: setup
	$(BIN)/python -m burst.demo

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
