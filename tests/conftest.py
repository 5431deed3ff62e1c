"""Test-suite hooks: GPU-marked tests are skipped, with the reason, where there is no CUDA device.

``@pytest.mark.gpu`` tests (tests/test_gpu.py) run on a GPU machine through
``scripts/gpu_check.sh`` (``pytest -m gpu``); on the CPU machines of CI they show up as skipped
with the reason below, never as silent passes.
"""

from __future__ import annotations

import pytest
import torch

NO_GPU_REASON = ("needs a CUDA device (torch.cuda.is_available() is False here); run "
                 "scripts/gpu_check.sh on a GPU machine")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
