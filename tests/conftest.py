"""Test-suite hooks: GPU-marked tests are skipped, with the reason, where there is no CUDA device.

``@pytest.mark.gpu`` tests (tests/test_gpu.py) run on a GPU machine through
``scripts/gpu_check.sh`` (``pytest -m gpu``); on the CPU machines of CI they show up as skipped
with the reason below, never as silent passes.
"""

from __future__ import annotations

from pathlib import Path

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


@pytest.fixture
def flip_state_bit():
    """``flip(path)``: flip one bit of the first value stored in the ``.../data/0`` record of a
    zip that torch.save wrote (the file stays a whole zip; only that record's CRC-32 no longer
    matches); flipping it again restores the file."""
    import zipfile

    def flip(path) -> None:
        with zipfile.ZipFile(path) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
        raw = bytearray(Path(path).read_bytes())
        # the record's data follows its 30-byte local header, its name and its extra field
        name_len, extra_len = (int.from_bytes(raw[info.header_offset + k:
                                                  info.header_offset + k + 2], "little")
                               for k in (26, 28))
        raw[info.header_offset + 30 + name_len + extra_len + 1] ^= 0x01
        Path(path).write_bytes(bytes(raw))

    return flip
