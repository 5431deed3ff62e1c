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

import torch
from torch.autograd.graph import saved_tensors_hooks

__all__ = ["ProfilerPeak", "SavedBytes", "cuda_peak", "reset_cuda_peak"]


class SavedBytes:
    """Bytes of distinct storages saved for backward inside the block, by the forward: what
    is kept from forward to backward. Tensors saved while backward runs (the recomputation of
    checkpointed layers) are transient and not counted.

    ``exclude``: storage pointers not to count (e.g. the parameters' ``untyped_storage()
    .data_ptr()``: matmuls save their weights, which no checkpointing mode can free), or a
    function giving them, called at the first tensor saved (FSDP's weights are gathered into
    new storage for the forward: they exist only then).
    """

    def __init__(self, exclude=()):
        self.bytes = 0
        self._exclude = exclude
        self._seen: set[int] | None = None if callable(exclude) else set(exclude)

    def _pack(self, t: torch.Tensor):
        if torch._C._current_graph_task_id() != -1:  # inside backward: a recomputation
            return t
        if self._seen is None:
            self._seen = set(self._exclude())
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
            if key not in self._seen and st.nbytes() > 0:
                self._seen.add(key)
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


class ProfilerPeak:
    """Peak of live CPU bytes (from the profiler's allocation events) above the entry level."""

    def __init__(self):
        self.peak_bytes = 0

    def __enter__(self):
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
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
