#!/usr/bin/env python3
"""The GPU check (issue 8): one command for a one-GPU machine, torch preinstalled, no internet.

    bash scripts/gpu_check.sh --out results/gpu/<run>          # on the GPU machine, < 8 minutes
    BURST_GIT_COMMIT=<sha> bash scripts/gpu_check.sh --out "$OUT/gpu"   # a copy without .git
    python scripts/gpu_check.py --dry-run --out /tmp/x         # the same flow, tiny, on CPU (CI)

Sections, each with its own time budget, skipped (a row says so) when the global deadline nears:
  tests   pytest -m gpu tests/test_gpu.py: kernel shim vs float64, emulated multi-rank
          BurstAttention per layout, the engine's tiny model (one row per test);
  kernel  the local kernel (``burst.kernel``, kernel convention of ``burst.flops``) against plain
          torch SDPA (default choice, and its flash / cuDNN backends named explicitly) at
          32K-128K tokens, 40 heads of 128, bf16, causal, forward and forward+backward;
          then whether torch's cuDNN op takes GQA (against the flash op on one block);
  ring    the emulated ring (``burst.emulate``, G = 8, 128K tokens, zigzag, causal): the sum of
          every per-step kernel+merge time of every rank against one monolithic kernel call over
          the whole sequence (same FLOPs): the per-step efficiency, forward and burst backward;
          and the stand-in ``out`` its backward builds per visiting block, timed;
  engine  one training step of a ~1B model (hidden 2048, 16 layers, 16 heads of 128) at
          32K-128K tokens, fused head on/off x each checkpointing mode: tokens/s, MFU (H200 peak
          989 TFLOP/s, DESIGN.md 4) under each ``burst.flops`` convention, CUDA peak memory.
          Each step starts from an emptied allocator cache, so its reserved peak is its own;
          its time includes growing the cache again (a few percent). A step the measured
          peaks predict out of memory is a skipped row;
  maxseq  the longest sequence that fits for each checkpointing mode: a linear fit of the
          engine section's peak memory predicts it, one step there checks it (retry 0.8x on OOM,
          capped by the time left: then the row says "fits at least").
Sections run in the order tests, ring, engine, maxseq, kernel (``SECTIONS``: why kernel last).
Each engine and ``burst.kernel`` row also holds the simulator's prediction for its cell on this
GPU's hardware profile (``spec.simulated``: ``_simulated``), printed last as measured over
simulated, so that a run checks the profile (h200's is fitted on results/gpu/h200_20261204_cudnn).
Every number is a ``results.schema`` row appended (and flushed) to <out>/rows.jsonl and
<out>/rows.csv as soon as it exists, so a kill loses nothing; OOM is a row with status oom. An
<out> used before keeps its rows and gains this run's, told apart by ``run_id`` (the start time);
junit_gpu.xml and env.json are this run's alone. A watchdog ends the process at the hard deadline
after writing a timeout row. A short table is printed last. Without a GPU (and without --dry-run)
it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

T_START = time.monotonic()  # the budget counts from here: torch's import and CUDA start-up
# take seconds, and gpu_check.sh's timeout counts them too
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from _args import positive_float  # noqa: E402  (scripts/, the folder a script runs from)

from burst import flops  # noqa: E402
from burst.emulate import RingEmulator  # noqa: E402
from burst.kernel import block_backward, block_forward, kernel_name  # noqa: E402
from burst.masks import CAUSAL  # noqa: E402
from burst.memory import cuda_peak, reset_cuda_peak  # noqa: E402
from burst.merge import row_delta  # noqa: E402
from burst.timing import repeat, time_call, time_calls  # noqa: E402
from results.schema import COLUMNS, empty_row  # noqa: E402

# the kernel section runs last: it calls torch's cuDNN and flash SDPA at up to 128K tokens, and
# a fault inside a library kernel is sticky (every later CUDA call of the process fails), so it
# must not cost the ring, engine and max-length rows of a run that cannot be repeated
SECTIONS = ("tests", "ring", "engine", "maxseq", "kernel")
MODES = flops.CHECKPOINTING


@dataclass(frozen=True)
class Sizes:
    """What each section runs; ``full`` on the GPU, ``dry`` (tiny, CPU) for CI."""

    device: str
    dtype: torch.dtype
    budget_s: float  # global; the watchdog ends the run 10 s after it
    section_s: dict
    kernel_seqs: tuple[int, ...]
    heads: int
    head_dim: int
    ring_world: int
    ring_seq: int
    engine_seqs: tuple[int, ...]
    engine_model: str
    seq_quantum: int  # sequence lengths of the max-fit search are multiples of it


FULL = Sizes("cuda", torch.bfloat16, 450.0,
             dict(tests=190, kernel=60, ring=35, engine=110, maxseq=55),
             (32768, 65536, 131072), 40, 128, 8, 131072, (32768, 65536, 131072), "1b", 16384)
DRY = Sizes("cpu", torch.float32, 40.0,
            dict(tests=25, kernel=4, ring=4, engine=6, maxseq=4),
            (256, 512), 2, 16, 4, 512, (64, 128), "tiny", 64)


class Budget:
    def __init__(self, total_s: float, t0: float | None = None):
        self.t0 = time.monotonic() if t0 is None else t0
        self.end = self.t0 + total_s
        self.section_end = self.end
        self.section = "start"

    def enter(self, name: str, seconds: float, reserve: float = 0.0) -> None:
        """``reserve``: seconds kept for the sections still to come (an overrun here must not
        eat the last section's time)."""
        self.section = name
        self.section_end = min(time.monotonic() + seconds, self.end - reserve)

    def left(self) -> float:
        return self.section_end - time.monotonic()

    def global_left(self) -> float:
        return self.end - time.monotonic()


# what a row measured: its id in the results store, as a sweep cell's (``suites.cells``)
_IDENTITY = ("sweep", "workload", "method", "label", "seq_len", "dtype", "method_options",
             "checkpointing", "fused_head")


def row_id(row: dict, taken: set[str] = frozenset()) -> str:
    """A row's ``cell_id``: a hash of what it measured, so that ``results.store`` (and
    ``burst-bench show``) reads these folders like a sweep's runs; an id already ``taken`` in
    this run gets the next free suffix (-2, -3, ...), so no row hides another."""
    from suites.cells import stable_id

    base = stable_id({k: row.get(k) for k in _IDENTITY})
    out, n = base, 1
    while out in taken:
        n += 1
        out = f"{base}-{n}"
    return out


class Rows:
    """Append-and-flush result rows (JSONL and CSV) with the run's provenance filled in; the
    folder's run.json says when its first run started (``results.store`` orders runs by it)."""

    def __init__(self, out: Path, base: dict):
        from results.store import created_stamp, read_meta, write_meta

        out.mkdir(parents=True, exist_ok=True)
        self.jsonl, self.csv, self.base = out / "rows.jsonl", out / "rows.csv", base
        self.lock = threading.Lock()
        self.written: list[dict] = []
        self.ids: set[str] = set()
        if not read_meta(out).get("created"):
            write_meta(out, {"created": created_stamp(),
                             "sweep": "gpu_check",
                             "source": "scripts/gpu_check.sh"})

    def write(self, **cols) -> dict:
        from results.store import append_row
        from suites.provenance import now_iso

        row = empty_row()
        row.update(self.base)
        unknown = set(cols) - set(COLUMNS)
        assert not unknown, f"not result columns: {sorted(unknown)}"
        row.update(cols)
        row["date"] = now_iso()
        if isinstance(row.get("spec"), dict):
            row["spec"] = json.dumps(row["spec"], sort_keys=True, default=str)
        with self.lock:
            row["cell_id"] = row_id(row, self.ids)
            self.ids.add(row["cell_id"])
            new = not self.csv.exists()
            append_row(self.jsonl, row)
            with open(self.csv, "a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(COLUMNS))
                if new:
                    w.writeheader()
                w.writerow({k: "" if v is None else v for k, v in row.items()})
                f.flush()
            self.written.append(row)
        val = next((f"{row[k]:.4g} {k}" for k in ("attn_tflops", "tokens_per_s", "time_s")
                    if isinstance(row.get(k), float)), row.get("error") or "")
        print(f"  row: {row.get('label') or row.get('method')} seq={row.get('seq_len')} "
              f"{row['status']} {str(val)[:80]}", flush=True)
        return row


def _peak(sz: Sizes) -> float | None:
    """Dense bf16 peak of this GPU by its name (the engine section runs in bf16)."""
    if sz.device != "cuda" or not torch.cuda.is_available():
        return None
    return flops.peak_tflops(torch.cuda.get_device_name())


def _provenance(sz: Sizes) -> dict:
    from results.store import new_run_id
    from suites.measure import device_name
    from suites.provenance import code_provenance, host_provenance

    base = dict(sweep="gpu_check", source="measured", executor="inline", device=sz.device,
                device_count=1, world=1, nodes=1, run_id=new_run_id(),
                peak_tflops=_peak(sz))
    base.update(code_provenance())
    base.update(host_provenance(sz.device))
    base["device_name"] = device_name(sz.device)
    base["hardware"] = base["device_name"]
    return base


# A fault inside a CUDA kernel (illegal address, device-side assert) poisons the process: every
# later CUDA call fails. The first one is kept here; later CUDA work is skipped with its text.
STICKY: list[str] = []
_STICKY_MARKS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                 "CUDA error: an illegal", "misaligned address")


def _broken() -> str | None:
    return f"the CUDA context broke earlier: {STICKY[0]}" if STICKY else None


def _write_env(out: Path, sz: Sizes) -> None:
    """<out>/env.json: what the rows' columns do not hold (driver, cuDNN, the allocator's
    settings, the GPU as nvidia-smi names it)."""
    env = {"python": sys.executable, "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
           else None, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "device": sz.device}
    with contextlib.suppress(Exception):
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    out.mkdir(parents=True, exist_ok=True)
    (out / "env.json").write_text(json.dumps(env, indent=1) + "\n")


def _guard(fn):
    """Run ``fn``; (status, value, error text). OOM and errors become statuses, never crashes;
    the allocator is emptied afterwards so the next try starts clean (a cleanup that fails after
    a sticky CUDA fault is ignored: the fault is the row)."""
    if STICKY:
        return "skipped", None, _broken()
    try:
        return "ok", fn(), None
    except torch.cuda.OutOfMemoryError as e:
        return "oom", None, str(e).splitlines()[0][:300]
    except Exception as e:  # an OOM some libraries report as a plain RuntimeError
        text = str(e)
        if any(s in text for s in ("out of memory", "ALLOC_FAILED")):
            return "oom", None, text.splitlines()[0][:300]
        if any(s in text for s in _STICKY_MARKS):
            STICKY.append((text.splitlines() or [""])[0][:300])
        return "error", None, traceback.format_exc(limit=4)[-1500:]
    finally:
        with contextlib.suppress(Exception):
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _skip(rows: Rows, workload: str, label: str, why: str, **cols) -> None:
    rows.write(workload=workload, label=label, status="skipped", error=why, **cols)


_GROUPS: set[int] = set()  # process groups of running children (killed by the watchdog too)


def _kill_groups() -> None:
    for pgid in list(_GROUPS):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _interrupt(signum, frame):
    """SIGTERM / SIGHUP end the run as Ctrl-C does, so a child's group is killed on the way."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _run_in_group(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) in a new session: on timeout the whole
    group is killed, the ranks a test spawned with it (they held GPUs for the later sections);
    so it is when this process is interrupted (the group is not the terminal's any more)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kw) as p:
        _GROUPS.add(p.pid)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
        except BaseException:  # Ctrl-C, SIGTERM (main: _interrupt): its session gets neither
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            raise
        finally:
            _GROUPS.discard(p.pid)
    # a rank a killed test spawned outlives it in the session and keeps the GPU: end it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


# ---------------------------------------------------------------------------------------------
# tests


_PYTEST_STATUS = {"PASSED": "ok", "FAILED": "error", "ERROR": "error", "SKIPPED": "skipped"}


class _RowsOn:
    """``rows`` whose every row also takes ``cols`` (a section's own provenance)."""

    def __init__(self, rows: Rows, **cols):
        self.rows, self.cols = rows, cols

    def write(self, **cols) -> dict:
        return self.rows.write(**{**self.cols, **cols})


def _progress_rows(rows: Rows, text: str) -> int:
    """A row per test that pytest -v's progress lines name as finished (no junit file after a
    kill or a crash); how many."""
    n = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "::" in parts[0] and parts[1] in _PYTEST_STATUS:
            rows.write(workload="gpu_tests", method="pytest", label=parts[0],
                       status=_PYTEST_STATUS[parts[1]])
            n += 1
    return n


def section_tests(rows: Rows, sz: Sizes, budget: Budget, out: Path, dry: bool) -> None:
    # pytest sees every GPU of the machine: its summary says how many; a test uses one of them,
    # or up to 4 (the NCCL test), so with more than one a test's row says None (not known),
    # where every row said 1; the other sections' rows keep the provenance's one device
    seen = max(1, torch.cuda.device_count() if sz.device == "cuda" and not dry else 1)
    rows = _RowsOn(rows, device_count=1 if seen == 1 else None)
    junit = out / "junit_gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-v", "-rs",
           "-o", "addopts=", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if importlib.util.find_spec("pytest_timeout") is not None:  # a hung test fails alone
        cmd.append("--timeout=150")  # the training-script test starts CUDA + NCCL 5 times
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if dry:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run checks the plumbing: every test skips
    junit.unlink(missing_ok=True)  # a reused --out: an earlier run's file is not this one's
    t0 = time.monotonic()
    try:
        res = _run_in_group(cmd, timeout=max(5.0, budget.left()), cwd=REPO, env=env)
        (out / "pytest_gpu.txt").write_text(res.stdout[-200000:] + res.stderr[-50000:])
        tail = (res.stdout + res.stderr).strip().splitlines()[-1:] or [""]
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (
            e.stdout or "")
        (out / "pytest_gpu.txt").write_text(text[-200000:])
        _progress_rows(rows, text)
        rows.write(workload="gpu_tests", device_count=seen, label="pytest -m gpu",
                   status="timeout", time_s=time.monotonic() - t0,
                   error="pytest exceeded the section budget")
        return
    if not junit.exists():  # pytest died (a CUDA abort in a test): its progress lines remain
        n = _progress_rows(rows, res.stdout)
        rows.write(workload="gpu_tests", device_count=seen, label="pytest -m gpu (summary)",
                   status="error", time_s=time.monotonic() - t0,
                   error="pytest wrote no junit file",
                   spec={"returncode": res.returncode, "summary": tail[0], "cases": n})
        return
    cases = ET.parse(junit).getroot().iter("testcase")
    n = 0
    for case in cases:
        n += 1
        status, err = "ok", None
        for tag, st in (("failure", "error"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                status, err = st, ((el.get("message") or "") + "\n" + (el.text or ""))[-1500:]
                break
        rows.write(workload="gpu_tests", method="pytest", status=status, error=err,
                   label=f"{case.get('classname', '')}::{case.get('name', '')}",
                   time_s=float(case.get("time") or 0.0))
    rows.write(workload="gpu_tests", device_count=seen, label="pytest -m gpu (summary)",
               status="ok" if res.returncode in (0, 5) else "error",
               time_s=time.monotonic() - t0, error=None if n else "no junit test cases",
               spec={"returncode": res.returncode, "summary": tail[0], "cases": n})


# ---------------------------------------------------------------------------------------------
# kernel


def _qkv(n, sz: Sizes, seed=0, grad=False):
    g = torch.Generator(device=sz.device).manual_seed(seed)
    shape = (1, n, sz.heads, sz.head_dim)
    ts = [torch.randn(shape, generator=g, device=sz.device, dtype=sz.dtype) for _ in range(4)]
    if grad:
        for t in ts[:3]:
            t.requires_grad_()
    return ts


def _kernel_impls(sz: Sizes):
    """name -> (fwd(q,k,v,do) -> None, fwd_bwd(q,k,v,do) -> None)."""
    import torch.nn.functional as F

    def ours_fwd(q, k, v, do):
        block_forward(q, k, v, kind=CAUSAL)

    def ours_fb(q, k, v, do):
        out, lse = block_forward(q, k, v, kind=CAUSAL)
        delta = row_delta(do, out, torch.float32)
        # with its output, as SDPA's backward has it (without, a kernel that takes out gets a
        # stand-in built from delta: the burst backward's cost, not the kernel's)
        block_backward(do, q, k, v, lse, delta, kind=CAUSAL, out_BSHD=out)

    def sdpa(backend):
        def ctx():
            if backend is None:
                return contextlib.nullcontext()
            from torch.nn.attention import SDPBackend, sdpa_kernel

            return sdpa_kernel([getattr(SDPBackend, backend)])

        def fwd(q, k, v, do):
            with ctx(), torch.no_grad():
                F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                               is_causal=True)

        def fb(q, k, v, do):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            with ctx():
                o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                                   is_causal=True)
                torch.autograd.grad(o, leaves, do.transpose(1, 2))
        return fwd, fb

    impls = {"torch_sdpa": sdpa(None), "burst.kernel": (ours_fwd, ours_fb)}
    if sz.device == "cuda":  # cuDNN last: the least mature SDPA backend
        impls["torch_sdpa[flash]"] = sdpa("FLASH_ATTENTION")
        impls["torch_sdpa[cudnn]"] = sdpa("CUDNN_ATTENTION")
    return impls


def section_kernel(rows: Rows, sz: Sizes, budget: Budget) -> None:
    impls = _kernel_impls(sz)
    last: dict = {}  # (impl, pass) -> (seq, seconds) for the time estimate of the next size
    base_time: dict = {}
    # cuDNN, the least mature SDPA backend, after every other kernel at every length: a sticky
    # fault in it then costs no other kernel's rows
    late = [name for name in impls if "cudnn" in name]
    rounds = [[name for name in impls if name not in late], late]
    for n, names in ((n, names) for names in rounds if names for n in sz.kernel_seqs):
        q, k, v, do = _qkv(n, sz)
        reps = 3 if n < 131072 else 2
        fl_fb = flops.attention_kernel_flops(1, n, sz.heads, sz.head_dim, causal=True)
        fl_f = fl_fb / (1 + flops.BACKWARD_OVER_FORWARD)
        for name, (fwd, fb) in ((name, impls[name]) for name in names):
            for pas, fn, fl in (("fwd", fwd, fl_f), ("fwd+bwd", fb, fl_fb)):
                label = f"{name} {pas}"
                common = dict(workload="kernel", method=name, label=label, seq_len=n, batch=1,
                              heads=sz.heads, kv_heads=sz.heads, head_dim=sz.head_dim,
                              causal=True, dtype=str(sz.dtype).replace("torch.", ""),
                              warmup=1, repeats=reps)
                prev = last.get((name, pas))
                est = (prev[1] * (n / prev[0]) ** 2 if prev else 0.0) * (reps + 1)
                if est > budget.left():
                    _skip(rows, why=f"estimated {est:.0f} s > {budget.left():.0f} s left",
                          **common)
                    continue
                status, ts, err = _guard(lambda fn=fn, reps=reps, args=(q, k, v, do): repeat(
                    lambda: fn(*args), sz.device, warmup=1, repeats=reps))
                if status != "ok":
                    rows.write(status=status, error=err, **common)
                    continue
                t = statistics.median(ts)
                last[(name, pas)] = (n, t)
                if name == "torch_sdpa":
                    base_time[(n, pas)] = t
                spec = {}
                if name == "burst.kernel":
                    spec = {"kernel": kernel_name("auto", q, CAUSAL), **_simulated(sz, common)}
                rows.write(status="ok", time_s=t, time_s_min=min(ts), time_s_max=max(ts),
                           attn_tflops=fl / t / 1e12, tokens_per_s=n / t,
                           speedup=(base_time[(n, pas)] / t) if (n, pas) in base_time else None,
                           spec=dict(spec, flops=fl, baseline="torch_sdpa"), **common)
        del q, k, v, do
        _guard(lambda: None)
    _cudnn_gqa_probe(rows, sz, budget)


def _cudnn_gqa_probe(rows: Rows, sz: Sizes, budget: Budget, n: int = 8192, h: int = 32,
                     hk: int = 8) -> None:
    """Does torch's cuDNN op take GQA? The shim keeps GQA blocks on the flash op (0.6x of cuDNN
    on an H200) because torch's cuDNN backward passes the query's head count to its graph and
    no GPU has checked it; this compares the cuDNN op, forward and backward, with the flash op
    on one causal GQA block (a row of max |difference| per output; last, as the other cuDNN
    calls: a fault in it costs no other row; skipped with under 20 s left in its section, as
    building cuDNN graphs for new shapes takes seconds)."""
    common = dict(workload="kernel", method="cudnn_gqa_probe", seq_len=n, batch=1, heads=h,
                  kv_heads=hk, head_dim=128, causal=True,
                  dtype=str(sz.dtype).replace("torch.", ""), warmup=0, repeats=1,
                  label=f"cuDNN op with GQA ({h}/{hk} heads) against the flash op")
    if sz.device != "cuda" or torch.cuda.get_device_capability() < (9, 0):
        _skip(rows, why="needs a CUDA device of sm90 or newer (where the shim uses cuDNN)",
              **common)
        return
    if budget.left() < 20:
        _skip(rows, why=f"{budget.left():.0f} s left in the kernel section (< 20 s)", **common)
        return
    from burst import kernel

    def run():
        g = torch.Generator(device="cuda").manual_seed(3)
        q, do = (torch.randn(1, n, h, 128, generator=g, device="cuda", dtype=sz.dtype)
                 for _ in range(2))
        k, v = (torch.randn(1, n, hk, 128, generator=g, device="cuda", dtype=sz.dtype)
                for _ in range(2))
        out, lse = block_forward(q, k, v, kind=CAUSAL, backend="cuda_sdpa")  # flash: GQA
        delta = row_delta(do, out, torch.float32)
        want = [out, lse, *block_backward(do, q, k, v, lse, delta, kind=CAUSAL,
                                          backend="cuda_sdpa", out_BSHD=out)]
        scale = 128 ** -0.5
        got = [*kernel._cudnn_fwd(q, k, v, scale, True),
               *kernel._cudnn_bwd(do, q, k, v, out, lse, scale, True)]
        names = ("out", "lse", "dq", "dk", "dv")
        return ({x: float((a.float() - b.float()).abs().max())
                 for x, a, b in zip(names, got, want, strict=True)},
                {x: float(b.float().abs().max()) for x, b in zip(names, want, strict=True)},
                kernel_name("cuda_sdpa", q, CAUSAL, kv_heads=hk))

    status, res, err = _guard(run)
    spec = {} if res is None else {"max_abs_diff": res[0], "max_abs_flash": res[1],
                                   "shim_kernel": res[2]}
    rows.write(status=status, error=err, spec=spec, **common)


# ---------------------------------------------------------------------------------------------
# ring


def section_ring(rows: Rows, sz: Sizes, budget: Budget) -> None:
    g, n = sz.ring_world, sz.ring_seq
    q, k, v, do = _qkv(n, sz, seed=1)
    common = dict(workload="ring_emulation", method="burst", seq_len=n, batch=1, heads=sz.heads,
                  kv_heads=sz.heads, head_dim=sz.head_dim, causal=True, world=g,
                  dtype=str(sz.dtype).replace("torch.", ""), warmup=1, repeats=2,
                  method_options=json.dumps({"layout": "zigzag", "backward": "burst",
                                             "emulated_world": g}))
    fl_fb = flops.attention_kernel_flops(1, n, sz.heads, sz.head_dim, causal=True)
    fl_fwd = fl_fb / (1 + flops.BACKWARD_OVER_FORWARD)
    fl_bwd = fl_fb - fl_fwd

    def mono():
        out, lse = block_forward(q, k, v, kind=CAUSAL)
        delta = row_delta(do, out, torch.float32)
        t_f = [time_call(lambda: block_forward(q, k, v, kind=CAUSAL), sz.device)
               for _ in range(3)][1:]
        t_b = [time_call(lambda: block_backward(do, q, k, v, lse, delta, kind=CAUSAL),
                         sz.device) for _ in range(3)][1:]
        return out, statistics.median(t_f), statistics.median(t_b)

    status, res, err = _guard(mono)
    if status != "ok":
        rows.write(label="monolithic kernel", status=status, error=err, **common)
        return
    out_mono, t_mf, t_mb = res
    for pas, t, fl in (("fwd", t_mf, fl_fwd), ("bwd", t_mb, fl_bwd)):
        rows.write(label=f"monolithic kernel {pas}", status="ok", time_s=t,
                   attn_tflops=fl / t / 1e12, spec={"calls": 1}, **common)
    if budget.left() < 6 * (t_mf + t_mb) + (5 if sz.device == "cuda" else 0):
        _skip(rows, label="emulated ring", why="not enough section time left", **common)
        return

    def ring():
        em = RingEmulator(q, k, v, world=g, causal=True, layout="zigzag")
        fwd_sums, bwd_sums, steps_f, steps_b = _time_emulated(em, do, sz.device)
        diff = float((em.unshard(em.out).float() - out_mono.float()).abs().max())
        return fwd_sums, bwd_sums, steps_f, steps_b, diff

    status, res, err = _guard(ring)
    if status != "ok":
        rows.write(label="emulated ring", status=status, error=err, **common)
        return
    fwd_sums, bwd_sums, steps_f, steps_b, diff = res
    for pas, sums, steps, t_mono, fl in (("fwd", fwd_sums, steps_f, t_mf, fl_fwd),
                                         ("bwd", bwd_sums, steps_b, t_mb, fl_bwd),
                                         ("fwd+bwd", [a + b for a, b in zip(fwd_sums, bwd_sums,
                                                                            strict=True)],
                                          steps_f + steps_b, t_mf + t_mb, fl_fb)):
        t = statistics.median(sums)
        rows.write(label=f"emulated ring {pas} (sum of per-step times)", status="ok", time_s=t,
                   time_s_min=min(sums), time_s_max=max(sums), attn_tflops=fl / t / 1e12,
                   speedup=t_mono / t,  # per-step efficiency: monolithic / ring
                   spec={"steps": len(steps), "step_median_s": statistics.median(steps),
                         "step_max_s": max(steps), "monolithic_s": t_mono,
                         "efficiency": t_mono / t, "max_diff_vs_monolithic": diff,
                         "note": "all G ranks' steps; same FLOPs as the monolithic call"},
                   **common)
    _stand_in_row(rows, sz, do, common, g, bwd_sums)
    _windowed_ring(rows, sz, budget, q, k, v, do, common, t_mf + t_mb, fl_fb)


def _stand_in_row(rows: Rows, sz: Sizes, do, common: dict, g: int, bwd_sums) -> None:
    """The stand-in ``out`` the burst backward builds at every visit of a query block (its
    kernels recompute D from dO and out): its time for one rank's block of n/G tokens, and G x G
    of them over the emulated backward (an upper bound: zigzag's half-block visits build half)."""
    from burst import kernel

    block = do[:, : do.shape[1] // g].contiguous()
    delta = torch.randn(1, block.shape[2], block.shape[1], device=block.device)
    status, ts, err = _guard(lambda: repeat(lambda: kernel._stand_in_out(block, delta),
                                            sz.device, warmup=1, repeats=3))
    label = f"stand-in out for one block of n/G = {block.shape[1]} tokens"
    if status != "ok":
        rows.write(label=label, status=status, error=err, **common)
        return
    t = statistics.median(ts)
    rows.write(label=label, status="ok", time_s=t, time_s_min=min(ts), time_s_max=max(ts),
               spec={"visits": g * g, "share_of_backward_at_most": g * g * t /
                     statistics.median(bwd_sums)}, **common)


def _time_emulated(em, do, device: str, repeats: int = 3):
    """Every rank's forward steps, then backward steps, timed ``repeats`` times (the first
    warms up and is dropped): (forward sums, backward sums, last forward and backward per-step
    times). Leaves the forward's out and lse in ``em``."""
    g, fwd_sums, bwd_sums = em.world, [], []
    for _ in range(repeats):
        state = em.new_forward_state()
        steps_f = time_calls([c for r in range(g) for _, c in em.forward_calls(r, state)], device)
        fwd_sums.append(sum(steps_f))
    em.out = [o.to(em.dtype) for o, _ in state]
    em.lse = [lse for _, lse in state]
    for _ in range(repeats):
        bstate = em.new_backward_state(do)  # D = rowsum(dO*O): not timed on either side
        steps_b = time_calls([c for r in range(g) for _, c in em.backward_calls(r, bstate)],
                             device)
        bwd_sums.append(sum(steps_b))
    return fwd_sums[1:], bwd_sums[1:], steps_f, steps_b


def _windowed_ring(rows: Rows, sz: Sizes, budget: Budget, q, k, v, do, common: dict,
                   t_mono: float, fl_mono: float) -> None:
    """The same emulated ring under a sliding window of a quarter of a rank's block: its partly
    visible blocks are tiled (``burst.masks.plan_pair``: mask-free pieces and small DENSE tiles
    whose masks are built on the device). Its rate on the visible pairs against the monolithic
    causal call's rate says what the tiling costs on this GPU (many small calls)."""
    from burst.masks import DENSE, MaskSpec, plan_pair

    g, n = sz.ring_world, sz.ring_seq
    win = (max(1, n // (4 * g)), 0)
    common = dict(common, window=json.dumps(list(win)))
    if budget.left() < 3 * t_mono + (5 if sz.device == "cuda" else 0):
        _skip(rows, label="emulated ring, window", why="not enough section time left", **common)
        return

    def ring():
        em = RingEmulator(q, k, v, world=g, causal=True, layout="zigzag", window=win)
        fwd_sums, bwd_sums, _, _ = _time_emulated(em, do, sz.device)
        return [a + b for a, b in zip(fwd_sums, bwd_sums, strict=True)]

    status, res, err = _guard(ring)
    if status != "ok":
        rows.write(label="emulated ring, window", status=status, error=err, **common)
        return
    spec = MaskSpec(causal=True, window=win)
    calls = [c for r in range(g) for s in range(g)
             for c in plan_pair(spec, "zigzag", g, r, s, n // g)]
    fl = flops.attention_kernel_flops(1, n, sz.heads, sz.head_dim, causal=True, window=win)
    t = statistics.median(res)
    rows.write(label="emulated ring fwd+bwd, window (sum of per-step times)", status="ok",
               time_s=t, time_s_min=min(res), time_s_max=max(res), attn_tflops=fl / t / 1e12,
               spec={"window": list(win), "calls_per_pass": len(calls),
                     "dense_tiles": sum(c.kind == DENSE for c in calls),
                     "rate_vs_monolithic_causal": (fl / t) / (fl_mono / t_mono),
                     "note": "TFLOP/s on the visible pairs; rate_vs_monolithic_causal < 1 is "
                             "what the tiling and the window's small calls cost"},
               **common)


# ---------------------------------------------------------------------------------------------
# engine


# the GPUs whose hardware profile describes them, by the name torch reports: exact models only
# (a GH200, an A100 40GB or an H100 PCIe / NVL would be priced as another GPU)
SIM_PROFILES = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100",
                "NVIDIA A800-SXM4-80GB": "a800", "NVIDIA A100-SXM4-80GB": "a100"}


def sim_profile(sz: Sizes, name: str | None = None) -> str | None:
    """The simulator's hardware profile for this GPU (``SIM_PROFILES``; None: no profile, no
    comparison); the dry run prices on h200, the GPU this project is lent, to exercise the
    path."""
    if sz.device != "cuda":
        return "h200"
    return SIM_PROFILES.get((name or torch.cuda.get_device_name()).strip())


def _sim_cell(row: dict) -> dict:
    """The simulator's cell for a measured row (its columns): a ``burst.kernel`` row is one
    attention call on one GPU, an engine row (train_step, max_seq) one training step."""
    common = dict(method="burst", seq_len=row["seq_len"], world=1, batch=1,
                  dtype=row.get("dtype") or "bfloat16")
    if row["workload"] == "kernel":
        return dict(common, workload="attention", heads=row["heads"], head_dim=row["head_dim"])
    return dict(common, workload="train_step", model=row["model"],
                checkpointing=row["checkpointing"], fused_head=row["fused_head"],
                options=json.loads(row.get("method_options") or "{}"))


def _prediction(profile: str, cell: dict) -> dict:
    """``suites.simulate``'s prediction for ``cell`` on ``profile``, as a row's spec keeps it."""
    from suites.hardware import load
    from suites.simulate import predict

    p = predict(cell, load(profile))
    out = {"profile": profile, "status": p.status, "error": p.error, "time_s": p.time_s}
    if p.attn is not None:
        out.update(forward_s=p.attn.forward_s, backward_s=p.attn.backward_s)
    if p.memory is not None:
        out.update(allocated_bytes=p.memory.allocated, reserved_bytes=p.memory.reserved)
    return out


def _simulated(sz: Sizes, row: dict) -> dict:
    """What ``suites.simulate`` predicts for the cell a row measured (``row``: its columns), on
    this GPU's profile: {"simulated": {profile, status, time_s, forward_s, reserved_bytes, ...}}
    for the row's spec, so that a run checks the simulator (h200: fitted on an earlier run,
    results/gpu). Never raises: the measurement stands, and the prediction says why it is
    missing (the simulator's imports need tomllib or tomli, which the machine's own Python may
    lack)."""
    prof = sim_profile(sz)
    if prof is None:
        return {}
    try:
        return {"simulated": _prediction(prof, _sim_cell(row))}
    except Exception as e:
        return {"simulated": {"profile": prof, "error": f"{type(e).__name__}: {e}"}}


def _trainer(sz: Sizes):
    """One Trainer reused for every mode (modes are switched on the model between steps).

    The engine draws its weights in fp32 on the host from a seed (device-independent); for
    a 1B model that costs tens of seconds of the budget, and weight values do not change speed
    or memory, so on the GPU the default module init runs on the device instead."""
    from burst.engine import model as engine_model
    from burst.engine.configs import get_config
    from burst.engine.trainer import Trainer

    cfg = get_config(sz.engine_model)
    # lr ~0: the steps measure, they need not train (a non-finite loss would end the section)
    kw = dict(attention_options={"layout": "striped"}, device=sz.device, dtype=sz.dtype,
              checkpointing="none", fused_head=True, seed=0, lr=1e-12)
    if sz.device != "cuda":
        return Trainer(cfg, **kw), cfg
    original = engine_model.CausalLM.reset_parameters
    engine_model.CausalLM.reset_parameters = lambda self, seed, std=0.02: None
    try:
        try:
            with torch.device("cuda"):
                tr = Trainer(cfg, **kw)
        except Exception:
            tr = Trainer(cfg, **kw)
    finally:
        engine_model.CausalLM.reset_parameters = original
    with torch.no_grad():
        for p in tr.model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return tr, cfg


def _set_mode(tr, mode: str, fused: bool) -> None:
    tr.checkpointing = tr.model.checkpointing = mode
    tr.model.fused_head = fused


def _engine_step(tr, sz: Sizes, n: int, mode: str, fused: bool):
    _set_mode(tr, mode, fused)
    batch = tr.local_batch(seq_len=n, seed=0)
    reset_cuda_peak()
    try:
        t = time_call(lambda: tr.step(*batch), sz.device)
    finally:
        tr.model.cache.clear()
        tr.optimizer.zero_grad(set_to_none=True)
    peak = cuda_peak() if sz.device == "cuda" else {"allocated": None, "reserved": None}
    return t, peak


def _engine_row(rows: Rows, sz: Sizes, cfg, n, mode, fused, status, res, err, workload,
                label, extra=None):
    from burst.engine.configs import param_count

    common = dict(workload=workload, method="burst", model=sz.engine_model,
                  checkpointing=mode, fused_head=fused, seq_len=n, batch=1,
                  heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                  causal=True, dtype=str(sz.dtype).replace("torch.", ""), label=label,
                  method_options=json.dumps({"layout": "striped"}), warmup=0, repeats=1)
    spec = dict(extra or {}, params=param_count(cfg), layers=cfg.num_layers,
                hidden=cfg.hidden_size, ffn=cfg.ffn_size, vocab=cfg.vocab_size)
    if status in ("ok", "oom") and n and workload != "train_step_warmup":
        spec.update(_simulated(sz, common))
    if status != "ok":
        return rows.write(status=status, error=err, spec=spec, **common)
    t, peak = res
    cols = dict(time_s=t, mem_peak_bytes=peak["allocated"], mem_reserved_bytes=peak["reserved"])
    # _peak: None off a GPU, or on a GPU whose peak is not known
    cols.update(flops.rate_columns(time_s=t, batch=1, seq_len=n, world=1, peak=_peak(sz),
                                   cfg=cfg, checkpointing=mode))
    return rows.write(status="ok", spec=spec, **cols, **common)


def section_engine(rows: Rows, sz: Sizes, budget: Budget, state: dict) -> None:
    status, res, err = _guard(lambda: _trainer(sz))
    if status != "ok":
        rows.write(workload="train_step", label="engine setup", status=status, error=err)
        return
    tr, cfg = res
    state.update(trainer=tr, config=cfg, times={}, peaks={})
    oom: dict = {}
    capacity = torch.cuda.get_device_properties(0).total_memory if sz.device == "cuda" else None
    n0 = sz.engine_seqs[0]
    status, res, err = _guard(lambda: _engine_step(tr, sz, n0, "none", True))  # warm-up
    _engine_row(rows, sz, cfg, n0, "none", True, status, res, err, "train_step_warmup",
                "warm-up step (first use: allocations, kernel choice)")
    for n in sz.engine_seqs:
        combos = [(m, f) for f in (True, False) for m in MODES]
        if n == sz.engine_seqs[-1] and len(sz.engine_seqs) > 1:
            combos = [(m, True) for m in MODES] + [("full", False)]
        for mode, fused in combos:
            label = f"1 step, {mode}, {'fused' if fused else 'plain'} head"
            prev = state["times"].get((mode, fused))
            est = prev[1] * _hw(cfg, n, mode) / _hw(cfg, prev[0], mode) if prev else 0.0
            need = _extrapolate(state["peaks"].get(mode, []), n)  # fused: a plain head's floor
            why = (f"out of memory at {oom[(mode, fused)]} tokens already"
                   if (mode, fused) in oom else
                   f"predicted out of memory: ~{need / 2**30:.0f} GiB at {n} tokens (the "
                   f"measured peaks' line) > 0.92 x {capacity / 2**30:.0f} GiB"
                   if need and capacity and need > 0.92 * capacity else
                   f"estimated {est:.0f} s > {budget.left():.0f} s left"
                   if est > budget.left() else None)
            if why:
                _engine_row(rows, sz, cfg, n, mode, fused, "skipped", None, why, "train_step",
                            label)
                continue
            status, res, err = _guard(lambda n=n, mode=mode, fused=fused: _engine_step(
                tr, sz, n, mode, fused))
            _engine_row(rows, sz, cfg, n, mode, fused, status, res, err, "train_step", label)
            if status == "oom":
                oom[(mode, fused)] = n
            if status == "ok":
                state["times"][(mode, fused)] = (n, res[0])
                if fused and res[1]["allocated"]:
                    state["peaks"].setdefault(mode, []).append((n, res[1]["allocated"]))


def _hw(cfg, n, mode):
    return flops.model_flops(cfg, 1, n, "hardware_flops", checkpointing=mode)


# ---------------------------------------------------------------------------------------------
# maxseq


def _extrapolate(pts, n: int) -> float | None:
    """The peak memory at ``n`` tokens on the line through the last two measured peaks."""
    if len(pts) < 2:
        return None
    (n1, m1), (n2, m2) = pts[-2], pts[-1]
    return m2 + (m2 - m1) / (n2 - n1) * (n - n2)


def _predict(pts, capacity) -> float | None:
    """Longest length whose peak memory fits, from a line through the last two measured peaks
    (activations grow linearly with the sequence under flash attention); 8% headroom."""
    if not capacity or len(pts) < 2:
        return None
    (n1, m1), (n2, m2) = pts[-2], pts[-1]
    slope = (m2 - m1) / (n2 - n1)
    return n2 + (0.92 * capacity - m2) / slope if slope > 0 else None


def section_maxseq(rows: Rows, sz: Sizes, budget: Budget, state: dict) -> None:
    tr, cfg = state.get("trainer"), state.get("config")
    if tr is None:
        _skip(rows, "max_seq", "longest sequence", "the engine section did not build a model")
        return
    capacity = torch.cuda.get_device_properties(0).total_memory if sz.device == "cuda" else None
    modes = [m for m in MODES if (m, True) in state["times"]]
    quantum = sz.seq_quantum
    for i, mode in enumerate(modes):
        share = budget.left() / (len(modes) - i)  # split what is left among the modes
        n_ref, t_ref = state["times"][(mode, True)]  # the longest length measured to fit

        def est(n, mode=mode, n_ref=n_ref, t_ref=t_ref):  # one step, 30% margin
            return 1.3 * t_ref * _hw(cfg, n, mode) / _hw(cfg, n_ref, mode)

        pred = _predict(state["peaks"].get(mode, []), capacity)
        n_pred = max(quantum, int(pred) // quantum * quantum) if pred else None
        info = {"predicted_max": pred, "capacity_bytes": capacity, "measured_fit": n_ref}
        # the longest length whose estimated step time fits this mode's share of the budget
        lo, hi = n_ref, 2 * n_ref
        while est(hi) < share and hi < 1 << 26:
            lo, hi = hi, 2 * hi
        for _ in range(12):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if est(mid) < share else (lo, mid)
        limit = lo // quantum * quantum
        first = min(n_pred, limit) if n_pred else min(2 * n_ref, limit)
        if est(n_ref) > share or first <= n_ref:  # nothing longer than measured to try
            if n_pred is not None and n_pred <= n_ref:
                why = (f"the memory fit predicts {n_pred} tokens, no more than the {n_ref} "
                       "measured to fit (engine section)")
            else:
                why = (f"one step at {n_pred or 2 * n_ref} tokens would take ~"
                       f"{est(n_pred or 2 * n_ref) / 1.3:.0f} s (> {share:.0f} s left for "
                       f"this mode); {n_ref} tokens fit (engine section)")
            label = "predicted maximum (not run)" if n_pred else "not run"
            _engine_row(rows, sz, cfg, n_pred, mode, True, "skipped", None, why, "max_seq",
                        f"longest fit, {mode}: {label}", info)
            continue
        if n_pred is None:
            kind = "twice the longest measured (no memory fit)"
        elif first < n_pred:
            kind = "fits at least (time-capped below the prediction)"
        else:
            kind = "predicted maximum"
        for n in (first, max(quantum, int(0.8 * first) // quantum * quantum)):
            if n <= n_ref or (n != first and est(n) > budget.left()):
                break
            status, res, err = _guard(lambda n=n, mode=mode: _engine_step(tr, sz, n, mode, True))
            _engine_row(rows, sz, cfg, n, mode, True, status, res, err, "max_seq",
                        f"longest fit, {mode}: {kind}" if n == first else
                        f"longest fit, {mode}: 0.8x after OOM", info)
            if status != "oom":
                break


# ---------------------------------------------------------------------------------------------
# driver


def _table(rows: list[dict]) -> str:
    def f(x, fmt):
        return "" if x is None or x == "" else format(x, fmt)

    head = (f"{'workload':<15}{'label':<46}{'seq':>8}{'status':>8}{'time s':>9}{'TFLOP/s':>9}"
            f"{'tok/s':>10}{'MFU':>6}{'peakGiB':>8}{'ratio':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        tf = r.get("attn_tflops") or r.get("tflops_model_flops_causal")
        mem = r.get("mem_peak_bytes")
        lines.append(
            f"{(r.get('workload') or '')[:14]:<15}{(r.get('label') or '')[:45]:<46}"
            f"{f(r.get('seq_len'), 'd'):>8}{(r.get('status') or '')[:7]:>8}"
            f"{f(r.get('time_s'), '.3f'):>9}{f(tf, '.1f'):>9}{f(r.get('tokens_per_s'), '.0f'):>10}"
            f"{f(r.get('mfu_model_flops_causal'), '.2f'):>6}"
            f"{f(mem / 2**30 if mem else None, '.1f'):>8}{f(r.get('speedup'), '.2f'):>7}")
    return "\n".join(lines)


def _sim_lines(rows: list[dict], dry: bool = False, title: str = "this run") -> str:
    """Each measured row next to the simulator's prediction for it (``_simulated``): time and
    reserved memory, measured over simulated."""
    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    lines = []
    for r in rows:
        try:
            sim = json.loads(r.get("spec") or "{}").get("simulated")
        except (TypeError, ValueError):
            sim = None
        if not sim or r.get("status") not in ("ok", "oom"):
            continue
        if not lines:
            lines = [f"simulator ({sim['profile']} profile) against {title}, measured / "
                     "simulated" + (" (dry run: a CPU priced as that GPU, the path checked, "
                                    "not the model)" if dry else ""),
                     f"{'label':<46}{'seq':>8}  {'status':<10}{'time':>8}{'reserved':>10}"]
        fwd_only = (r.get("label") or "").endswith(" fwd")
        t_sim = sim.get("forward_s") if fwd_only else sim.get("time_s")
        lines.append(f"{(r.get('label') or '')[:45]:<46}{r.get('seq_len') or 0:>8}  "
                     f"{r['status'] + '/' + str(sim.get('status')):<10}"
                     f"{ratio(r.get('time_s'), t_sim):>8}"
                     f"{ratio(r.get('mem_reserved_bytes'), sim.get('reserved_bytes')):>10}")
    return "\n".join(lines)


def show(folder: Path) -> int:
    """The closing tables of the latest run whose rows are in ``folder`` (results/gpu/*)."""
    path = folder / "rows.jsonl"
    if not path.is_file():
        print(f"gpu_check --show: no {path}", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"gpu_check --show: {path} holds no rows", file=sys.stderr)
        return 2
    run = max(r["run_id"] for r in rows)
    rows = [r for r in rows if r["run_id"] == run]
    first = rows[0]
    print(f"{path}: run {run}, {first.get('device_name')}, torch {first.get('torch')}, "
          f"commit {str(first.get('git_commit'))[:12]}, {len(rows)} rows")
    print(_table(rows))
    dry = first.get("device") != "cuda"
    print(_sim_lines(rows, dry, title="this run (as predicted then)"))
    print(_sim_lines(_resimulated(rows), dry, title="this run (the profile as it is now)"))
    return 0


def _resimulated(rows: list[dict]) -> list[dict]:
    """The rows with each prediction made again by today's simulator and profile, to check a
    profile fitted on them."""
    out = []
    for r in rows:
        spec = json.loads(r.get("spec") or "{}") or {}
        sim = spec.get("simulated")
        if sim and "profile" in sim and r.get("status") in ("ok", "oom"):
            r = dict(r, spec=json.dumps(dict(spec, simulated=_prediction(sim["profile"],
                                                                         _sim_cell(r)))))
        out.append(r)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for rows.jsonl / rows.csv")
    ap.add_argument("--show", type=Path, metavar="FOLDER",
                    help="print the tables of a finished run's rows (FOLDER/rows.jsonl; its "
                         "latest run_id) and exit: no device needed")
    ap.add_argument("--dry-run", action="store_true", help="the whole flow, tiny, on CPU")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--budget-s", type=positive_float, default=None,
                    help="global time budget (s)")
    args = ap.parse_args(argv)
    if args.show is not None:
        return show(args.show)
    if args.out is None:
        ap.error("--out FOLDER is required (or --show FOLDER)")
    wanted = [s for s in args.sections.split(",") if s]
    bad = [s for s in wanted if s not in SECTIONS]
    if bad:
        ap.error(f"unknown sections {bad}; valid: {', '.join(SECTIONS)}")
    if not wanted:
        ap.error(f"--sections names no section; valid: {', '.join(SECTIONS)}")
    if not args.dry_run and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, {build}, python "
              f"{sys.executable}); nothing to do (use --dry-run to check the script on CPU)")
        return 0
    sz = DRY if args.dry_run else FULL
    if args.budget_s is not None:
        sz = Sizes(**{**sz.__dict__, "budget_s": args.budget_s})
    if sz.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    budget = Budget(sz.budget_s, T_START)
    rows = Rows(args.out, _provenance(sz))
    _write_env(args.out, sz)
    print(f"gpu_check: {rows.base['device_name']}, torch {torch.__version__}, budget "
          f"{sz.budget_s:.0f} s, rows -> {args.out}", flush=True)

    def bail():
        _kill_groups()
        rows.write(workload=budget.section, label="hard deadline", status="timeout",
                   error=f"the run passed its {sz.budget_s:.0f} s budget + 10 s; ended")
        print(_table(rows.written), flush=True)
        os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    watchdog = threading.Timer(max(1.0, budget.global_left() + 10.0), bail)
    watchdog.daemon = True
    watchdog.start()
    state: dict = {}
    runners = {
        "tests": lambda: section_tests(rows, sz, budget, args.out, args.dry_run),
        "kernel": lambda: section_kernel(rows, sz, budget),
        "ring": lambda: section_ring(rows, sz, budget),
        "engine": lambda: section_engine(rows, sz, budget, state),
        "maxseq": lambda: section_maxseq(rows, sz, budget, state),
    }
    order = [name for name in SECTIONS if name in wanted]
    for i, name in enumerate(order):
        if budget.global_left() < 0.1 * sz.section_s[name]:
            _skip(rows, name, f"section {name}", "global deadline near")
            continue
        if STICKY and sz.device == "cuda":
            _skip(rows, name, f"section {name}", _broken())
            continue
        later = sum(sz.section_s[s] for s in order[i + 1:])
        budget.enter(name, sz.section_s[name], reserve=min(later, 0.5 * budget.global_left()))
        t0 = time.monotonic()
        print(f"[{time.monotonic() - budget.t0:6.1f}s] {name} (budget {budget.left():.0f} s)",
              flush=True)
        status, _, err = _guard(runners[name])
        if status != "ok":
            rows.write(workload=name, label=f"section {name}", status=status, error=err)
        print(f"[{time.monotonic() - budget.t0:6.1f}s] {name} done in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
    watchdog.cancel()
    print(_table(rows.written), flush=True)
    print(_sim_lines(rows.written, sz.device != "cuda"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
