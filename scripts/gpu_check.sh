#!/usr/bin/env bash
# The GPU check (issue 8) on a one-GPU machine with torch preinstalled and no internet:
#   bash scripts/gpu_check.sh --out <folder>            # < 8 minutes, rows in <folder>/rows.*
#   bash scripts/gpu_check.sh --dry-run --out <folder>  # the same flow, tiny, on CPU
# scripts/gpu_check.py keeps its own 450 s budget (sections skip as the deadline nears, a
# watchdog ends it 10 s later); the timeout here is the last line of defence under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
# the machine's own Python (torch preinstalled on the GPU machine), else this repo's venv
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if python3 -c "import torch" >/dev/null 2>&1; then PY=python3; else PY=.venv/bin/python; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# fewer fragmentation OOMs near the memory limit (the engine steps at 64K-128K tokens)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
exec timeout -k 5 470 "$PY" scripts/gpu_check.py "$@"
