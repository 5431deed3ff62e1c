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
# (python3 just imported torch: not again, each import costs seconds on the GPU machine)
if [ "$PY" != python3 ] || [ -n "${PYTHON:-}" ] && ! "$PY" -c "import torch" >/dev/null 2>&1
then  # nothing to run the check with: say so
  tried="python3 and $PWD/.venv/bin/python"
  [ -n "${PYTHON:-}" ] && tried="PYTHON=$PYTHON"
  echo "gpu_check.sh: no Python with torch (tried $tried); set PYTHON=<an interpreter with" \
       "torch>, or run make setup" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# fewer fragmentation OOMs near the memory limit (the engine steps at 64K-128K tokens), where
# the driver maps virtual memory (a VM's may not: every allocation would fail); probed in a
# throwaway process of a few seconds (at most 20, so 20 + 475 s stay under the 540 s a device
# call allows), unset if it fails
if [ -z "${PYTORCH_CUDA_ALLOC_CONF:-}" ]; then
  if PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 20 "$PY" -c "
import torch
if torch.cuda.is_available():
    torch.empty(1 << 30, dtype=torch.uint8, device='cuda').fill_(1)
    torch.cuda.synchronize()" >/dev/null 2>&1; then
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  else
    echo "gpu_check.sh: expandable_segments probe failed; the default CUDA allocator is used"
  fi
fi
# the script's budget (--budget-s, default 450 s) + its watchdog's 10 s + 10 s of margin
limit=470
prev=
for a in "$@"; do
  case "$prev" in --budget-s) limit=$(awk -v b="$a" 'BEGIN { printf "%d", b + 20.999 }') ;; esac
  case "$a" in --budget-s=*) limit=$(awk -v b="${a#*=}" 'BEGIN { printf "%d", b + 20.999 }') ;; esac
  prev=$a
done
exec timeout -k 5 "$limit" "$PY" scripts/gpu_check.py "$@"
