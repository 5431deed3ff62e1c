"""Where a result row came from (STYLE principle 8): code, versions, machine, job, time.

``code_provenance`` is taken by the sweep driver (the git state of the code it launches) and
again by rank 0 of every submitit job when it starts (a shared checkout may have moved while the
job queued); ``host_provenance`` on rank 0 where the cell actually runs (versions, host, job id),
so a row produced on a SLURM node names that node's CUDA/NCCL, not the login node's. A git that
fails or times out gives ``git_dirty`` None (unknown), not False.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import importlib
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["code_provenance", "host_provenance", "job_id", "method_source", "now_iso"]

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


# what a run writes and may rewrite: result data (not the results package's code), the
# rendered figures; everything else, tracked or new, is code a run may import
_DATA = (":(exclude,glob)results/*/**", ":(exclude,glob)results/*.csv",
         ":(exclude,glob)results/*.txt", ":(exclude,glob)paper_figures/out/**")


def code_provenance(data_dir: str | os.PathLike | None = None) -> dict:
    """git commit and dirty flag of the code: any change to tracked files, or a new untracked
    file, outside the result data (``results/`` subfolders and tables, not the ``results``
    package) and the rendered figures. Results being written, new or rewritten, do not make the
    code dirty (several sweeps simulated in one command rewrite committed tables); an edited
    ``results/tables.py`` or a new method file does. A copy of the tree (a lent GPU machine)
    takes the commit from ``BURST_GIT_COMMIT`` when whoever copied it sets it, before its own
    .git: a lent machine's copy may carry the .git of an older checkout (one run recorded the
    session's first commit for a later one's code); the dirty flag is then unknown (None).
    ``data_dir``: where the run writes (an ``--out`` inside the checkout but not under
    ``results/``), data too."""
    given = os.environ.get("BURST_GIT_COMMIT") or None
    commit = given or _git("rev-parse", "HEAD")
    if given is not None or commit is None:
        return {"git_commit": commit, "git_dirty": None}
    data = list(_DATA)
    if data_dir is not None:
        with contextlib.suppress(ValueError):  # outside the checkout: nothing to exclude
            rel = Path(data_dir).resolve().relative_to(REPO.resolve()).as_posix()
            if rel != ".":
                data.append(f":(exclude){rel}")
    dirty = _git("status", "--porcelain", "--untracked-files=all", "--", ".", *data)
    return {"git_commit": commit, "git_dirty": None if dirty is None else bool(dirty)}


def method_source(method: str, *, now: bool = False) -> str | None:
    """For a method given as an import path (``package.module:function``): the file of the
    module that defines the function (a package may re-export it) and the sha256 of that
    file's bytes, ``<path> sha256:<16 hex>``; read once per process, near when the process
    imported the module (what a rank's rows ran), or afresh with ``now``. A method outside
    this repository has no commit, and the rows of a resumed run must tell its versions apart
    (``suites.run`` says when they differ). None for a registered method (this project's code:
    ``git_commit``) or a module without a readable file."""
    return (_source.__wrapped__ if now else _source)(method)


@functools.cache
def _source(method: str) -> str | None:
    if ":" not in method:
        return None
    name, _, attr = method.partition(":")
    try:
        fn = getattr(sys.modules.get(name) or importlib.import_module(name), attr)
        defined = sys.modules.get(getattr(fn, "__module__", None) or name) or sys.modules[name]
        path = getattr(defined, "__file__", None)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else None
    except Exception:  # noqa: BLE001 - an unimportable module is the cell's own error
        return None
    return f"{path} sha256:{digest}" if digest else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def job_id() -> str | None:
    """submitit's local job id (a local job run inside a SLURM allocation is that job, not the
    allocation: its rows named the allocation's id, which the driver's record does not), else
    the SLURM job id (array jobs: <array job>_<task>), else None."""
    env = os.environ
    if env.get("SUBMITIT_LOCAL_JOB_ID"):
        return env["SUBMITIT_LOCAL_JOB_ID"]
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    return env.get("SLURM_JOB_ID")


def host_provenance(device: str) -> dict:
    import torch

    nccl = None
    if device == "cuda" and torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()  # a tuple on recent torch, an int on old ones
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (AttributeError, RuntimeError):
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "nccl": nccl,
        "flash_attn": _version("flash-attn") or _version("flash_attn"),
        "hostname": socket.gethostname(),
        "job_id": job_id(),
    }


def no_host() -> dict:
    """The host columns of a row no host of ours ran (simulated; a remote job's failure)."""
    return dict.fromkeys(("python", "torch", "cuda", "nccl", "flash_attn", "hostname", "job_id"))


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
