"""Timing of single calls on any device: CUDA events on GPU, ``perf_counter`` on CPU.

GPU work is asynchronous, so a host clock around a call measures the launch, not the kernel.
Each call here is bracketed by CUDA events on the current stream and the host synchronises once
per batch of calls (``time_calls``), so timing many small steps does not serialise them with
extra syncs. On CPU the host clock is the truth.

    t = time_call(lambda: block_forward(q, k, v), q.device)            # seconds
    ts = time_calls([f1, f2, f3], q.device)                              # per-call seconds
    ts = repeat(fn, q.device, warmup=1, repeats=3)                       # per-repeat seconds
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

__all__ = ["repeat", "synchronize", "time_call", "time_calls"]


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(calls: Sequence[Callable[[], object]], device: torch.device | str) -> list[float]:
    """Run ``calls`` in order; the seconds each one took on ``device``."""
    device = torch.device(device)
    if device.type != "cuda":
        out = []
        for call in calls:
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
        return out
    synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in calls]
    stream = torch.cuda.current_stream(device)  # the device's, not the current device's
    for call, (start, end) in zip(calls, events, strict=True):
        start.record(stream)
        call()
        end.record(stream)
    synchronize(device)
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def time_call(call: Callable[[], object], device: torch.device | str) -> float:
    return time_calls([call], device)[0]


def repeat(call: Callable[[], object], device: torch.device | str, *, warmup: int = 1,
           repeats: int = 3) -> list[float]:
    """Seconds of each of ``repeats`` timed calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    return [time_call(call, device) for _ in range(repeats)]
