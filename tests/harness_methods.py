"""Attention "methods" for the harness tests, used through import paths (``tests.harness_methods:
fn``) exactly as a user would plug in their own: one that works, and ones that fail in each way
a real cell can fail (an exception on one rank, a rank dying, OOM, a hang past the time limit).
All have the registry's call signature."""

from __future__ import annotations

import os
import signal
import time

import torch

from burst import burst_attn, comm


def user_attention(q, k, v, *, causal, softmax_scale=None, group=None):
    """A user's method: BurstAttention on the contiguous layout (the import-path default)."""
    return burst_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group,
                      layout="contiguous", backward="ring")


CALLS = [0]


def counts_its_calls(q, k, v, *, causal, softmax_scale=None, group=None):
    """``user_attention`` that counts its calls in ``CALLS`` (a test of the warm-up)."""
    CALLS[0] += 1
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


def slow_attention(q, k, v, *, causal, softmax_scale=None, group=None, delay=0.5):
    """Works, but takes ``delay`` seconds per call (gives a kill test time between rows)."""
    time.sleep(delay)
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


def fail_on_rank1(q, k, v, *, causal, softmax_scale=None, group=None):
    if comm.rank() == 1:
        raise RuntimeError("deliberate failure on rank 1")
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


def nan_on_rank1(q, k, v, *, causal, softmax_scale=None, group=None):
    """Runs, but rank 1's output is NaN (a broken kernel on one GPU)."""
    out = user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)
    return out * float("nan") if comm.rank() == 1 else out


def nan_output_on_rank1(q, k, v, *, causal, softmax_scale=None, group=None):
    """Rank 1's output is NaN, its gradients finite (a constant added): the NaN never reaches
    rank 0 through a transfer, only through the harness' finiteness vote."""
    out = user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)
    return out + torch.full_like(out, float("nan") if comm.rank() == 1 else 0.0)


def ignores_k_and_v(q, k, v, *, causal, softmax_scale=None, group=None):
    """Not attention: no gradient reaches k or v (a row of it was ok, with a time)."""
    return q * 2.0


def returns_half(q, k, v, *, causal, softmax_scale=None, group=None):
    """Attention whose output is float16 whatever q's dtype (its row was ok: the error of a
    float32 cell, 9e-4, is under float32's limit)."""
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                          group=group).half()


def returns_one_head(q, k, v, *, causal, softmax_scale=None, group=None):
    """Attention that keeps one head of its output (torch's "Mismatch in shape" at backward)."""
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                          group=group)[:, :, :1]


def returns_detached(q, k, v, *, causal, softmax_scale=None, group=None):
    """Attention made outside autograd (torch's "element 0 of tensors does not require grad"
    at backward)."""
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                          group=group).detach()


def ignores_causal(q, k, v, *, causal, softmax_scale=None, group=None):
    """Runs, finite, fast, and wrong: it drops the causal mask."""
    return user_attention(q, k, v, causal=False, softmax_scale=softmax_scale, group=group)


def off_by_five_percent(q, k, v, *, causal, softmax_scale=None, group=None):
    """Runs, finite, and 5% off (a wrong scale, a missed term): within WRONG_ABOVE's absolute
    limit in bfloat16, its row was ok (a user-method audit)."""
    return 1.05 * user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                 group=group)


def die_on_rank1(q, k, v, *, causal, softmax_scale=None, group=None):
    if comm.rank() == 1:
        os._exit(7)  # the process vanishes without a traceback, like a killed rank
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


def killed_on_rank1(q, k, v, *, causal, softmax_scale=None, group=None):
    """Rank 1 is SIGKILLed (the OOM killer, a user's kill -9) while rank 0 is busy elsewhere:
    nothing tells rank 0, which would notice only at its next collective."""
    if comm.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


def out_of_memory(q, k, v, *, causal, softmax_scale=None, group=None):
    err = getattr(torch, "OutOfMemoryError", RuntimeError)
    raise err("CUDA out of memory. Tried to allocate 80.00 GiB (simulated by the test)")


def hang(q, k, v, *, causal, softmax_scale=None, group=None):
    time.sleep(3600)
    raise AssertionError("unreachable: the cell's time limit ends the ranks first")


def hang_holding_the_gil(q, k, v, *, causal, softmax_scale=None, group=None):
    """Rank 0 hangs in a regular expression's backtracking, which holds the GIL: no thread of
    its process runs (a crash audit: a timer in rank 0 could not end it, 150 s past 6)."""
    import re

    if comm.rank() == 0:
        re.match(r"(a|aa)+$", "a" * 200 + "b")
    time.sleep(3600)  # the other ranks wait, as for a collective rank 0 never joins
    raise AssertionError("unreachable: the cell's time limit ends the ranks first")


def dies_between_cells_on_rank1(q, k, v, *, causal, softmax_scale=None, group=None):
    """Correct, but rank 1 then dies at the barrier after the cell (its row written), before
    the next cell starts: as the OOM killer might take it there (a crash audit)."""
    import sys

    if comm.rank() == 1 and comm.barrier.__name__ != "dying_barrier":
        real = comm.barrier

        def dying_barrier(*a, **kw):
            if sys._getframe(1).f_code.co_name == "_inline_ranks":  # the harness's, between
                os._exit(3)
            return real(*a, **kw)

        comm.barrier = dying_barrier
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)


UNLABELLED_ELEMS = {"forward": 3, "backward": 5}  # float32 elements each rank sends per call


class _UnlabelledSends(torch.autograd.Function):
    """The identity, whose forward and backward each all-gather a few zeros through burst.comm
    without a ``comm.phase`` label, as a user's method may."""

    @staticmethod
    def forward(ctx, x):
        comm.all_gather(torch.zeros(UNLABELLED_ELEMS["forward"]))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        comm.all_gather(torch.zeros(UNLABELLED_ELEMS["backward"]))
        return g


def unlabelled_sends(q, k, v, *, causal, softmax_scale=None, group=None):
    """``user_attention`` plus traffic of its own that no phase labels (``_UnlabelledSends``):
    its backward's bytes were counted as forward (a user-method audit)."""
    out = user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)
    return _UnlabelledSends.apply(out)


def talks_to_torch_distributed(q, k, v, *, causal, softmax_scale=None, group=None):
    """Communicates through torch.distributed itself, not burst.comm: its bytes are unknown."""
    import torch.distributed as dist

    from burst.reference import reference_attention

    dist.all_reduce(q.detach().sum().reshape(1).clone(), group=group)
    return reference_attention(q, k, v, causal=causal, scale=softmax_scale)[0]  # local only


def row_write_fails(q, k, v, *, causal, softmax_scale=None, group=None):
    """Works, but rank 0's write of this cell's row fails with ENOSPC after half a line, as on a
    disk full for a moment (the driver's own writes after it succeed); once: the file
    ``BURST_TEST_ONCE`` is made when it fails, and while it exists the write succeeds."""
    import errno
    from pathlib import Path

    from suites import executors

    once = Path(os.environ["BURST_TEST_ONCE"])
    if comm.rank() == 0 and not once.exists():
        append = executors.append_row

        def full(path, row):
            executors.append_row = append
            once.touch()
            with open(path, "a") as f:
                f.write('{"cell_id": "half a ro')
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        executors.append_row = full
    return user_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group)
