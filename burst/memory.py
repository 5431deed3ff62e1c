"""Memory measurement that is repeatable on CPU as well as GPU (DESIGN.md 4).

- ``SavedBytes``: exact bytes saved for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` (each storage once, so views of one tensor do not
  double count). Deterministic on every device.
- ``ProfilerPeak``: transient peak of allocated bytes on CPU from the profiler's raw memory
  events (RSS is noise on CPU: 15-40% between runs).
- ``cuda_peak``: max_memory_allocated / max_memory_reserved on GPU.

    with SavedBytes() as s:
        loss = model(x)
    s.bytes        # saved for backward by everything inside the block
    with ProfilerPeak() as p:
        step()
    p.peak_bytes   # transient CPU peak above the level at entry
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch.autograd.graph import saved_tensors_hooks

__all__ = ["ProfilerPeak", "SavedBytes", "cuda_peak", "parameter_storages", "reset_cuda_peak"]


class SavedBytes:
    """Bytes of distinct storages saved for backward inside the block, by the forward: what
    is kept from forward to backward. Tensors saved while backward runs (the recomputation of
    checkpointed layers) are transient and not counted.

    ``exclude``: storage pointers not to count (e.g. ``parameter_storages(model)``: matmuls save
    their weights, which no checkpointing mode can free), or a function giving them, asked again
    at each new storage saved: FSDP gathers each unit's weights into new storage for its
    forward only (per layer under ZeRO-3, freed when the layer is done), so the weights
    gathered now are excluded, and an activation later saved at a freed weight's address is
    counted.
    """

    def __init__(self, exclude=()):
        self.bytes = 0
        self._exclude = exclude if callable(exclude) else frozenset(exclude)
        self._counted: set[int] = set()  # saved, so alive (not reused) until the backward

    def _pack(self, t: torch.Tensor):
        if torch._C._current_graph_task_id() != -1:  # inside backward: a recomputation
            return t
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in self._counted or st.nbytes() == 0:
                return t
            if key in (self._exclude() if callable(self._exclude) else self._exclude):
                return t
            self._counted.add(key)
            self.bytes += st.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. meta)
            pass
        return t

    def __enter__(self):
        self._hooks = saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


def parameter_storages(module: torch.nn.Module) -> set[int]:
    """Storage pointers of ``module``'s parameters that hold data now: under FSDP, the units
    gathered at this moment (a sharded parameter's local shard is not what a matmul saves, and
    a freed gathered one has no storage)."""
    out = set()
    for p in module.parameters():
        try:
            st = p.untyped_storage()
            if st.nbytes() > 0:
                out.add(st.data_ptr())
        except (RuntimeError, NotImplementedError):  # a DTensor shard, or storage freed
            pass
    return out


@contextlib.contextmanager
def _no_native_stderr():
    """File descriptor 2 sent to /dev/null: torch 2.13's profiler (kineto) writes a line to it
    at every start and stop ("USDT:... profiler_start"), noise in a benchmark's output."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class ProfilerPeak:
    """Peak of live CPU bytes (from the profiler's allocation events) above the entry level."""

    def __init__(self):
        self.peak_bytes = 0

    def __enter__(self):
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            profile_memory=True)
        with _no_native_stderr():
            self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        with _no_native_stderr():
            self._prof.__exit__(*exc)
        live = peak = 0
        events = [e for e in self._prof.profiler.kineto_results.events()
                  if e.device_type() == torch.autograd.DeviceType.CPU and e.name() ==
                  "[memory]"]
        for e in sorted(events, key=lambda e: e.start_ns()):
            live += e.nbytes()
            peak = max(peak, live)
        self.peak_bytes = peak
        return False


def reset_cuda_peak(device=None) -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peak(device=None) -> dict[str, int]:
    """{"allocated": max_memory_allocated, "reserved": max_memory_reserved} in bytes."""
    if not torch.cuda.is_available():
        return {"allocated": 0, "reserved": 0}
    return {"allocated": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.max_memory_reserved(device)}
