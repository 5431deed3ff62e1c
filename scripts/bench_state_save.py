"""Memory and seconds of ``Trainer.save`` / ``Trainer.load``: one file gathered on rank 0
against every rank's own shards (``sharded=True``), on G local gloo ranks under FSDP; and the
sharded save that does not wait (``wait=False``): its call (each rank's copy of its state),
then ``finish_save`` at once (the write the call left to a background thread, which a run
would overlap with its next steps).

    .venv/bin/python scripts/bench_state_save.py [--world 4] [--layers 12] [--hidden 1024]

The model (float32, AdamW after one step: 12 bytes of state per parameter) is built from
``--layers`` and ``--hidden``; each rank samples its anonymous memory (RssAnon: what the state
takes in the process, not the page cache) every 5 ms during each call, and the table gives,
per format and call, the wall seconds and the peak over the ranks of RssAnon above what the
rank held before the call, for rank 0 and for the others.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import torch

from burst.engine import Trainer, param_count
from burst.engine.configs import ModelConfig
from burst.spawn import spawn


def _anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def _measured(fn) -> tuple[float, int]:
    """(seconds, peak RssAnon above the start) of ``fn()``, sampled every 5 ms."""
    start, peak, done = _anon_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _anon_bytes())
            time.sleep(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    return seconds, max(peak[0], _anon_bytes()) - start


def _rank(rank: int, world: int, cfg: ModelConfig, folder: str) -> dict:
    kw = dict(cp_degree=1, data_parallel="fsdp", dtype=torch.float32, optimizer="adamw")
    tr = Trainer(cfg, **kw)
    tr.step(*tr.local_batch(64, batch=1, seed=0))  # AdamW's moments exist
    out = {}
    for name, path, sharded in (("file", Path(folder) / "state.pt", False),
                                ("sharded", Path(folder) / "state", True)):
        out[name, "save"] = _measured(lambda p=path, s=sharded: tr.save(p, sharded=s))
        again = Trainer(cfg, seed=1, **kw)
        out[name, "load"] = _measured(lambda p=path, a=again: a.load(p))
        del again
    path = Path(folder) / "state_async"
    out["async", "save"] = _measured(lambda: tr.save(path, sharded=True, wait=False))
    out["async", "finish"] = _measured(tr.finish_save)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=1024)
    a = p.parse_args(argv)
    if a.world < 1 or a.layers < 1 or a.hidden < 64 or a.hidden % 64:
        p.error("--world and --layers: at least 1; --hidden: a multiple of 64")
    cfg = ModelConfig(hidden_size=a.hidden, num_layers=a.layers, num_heads=a.hidden // 64,
                      num_kv_heads=a.hidden // 64, ffn_size=a.hidden * 11 // 4,
                      vocab_size=32000)
    n = param_count(cfg)
    print(f"{n / 1e6:.0f}M parameters, float32 + AdamW: {n * 12 / 2**30:.2f} GiB of state; "
          f"{a.world} gloo ranks, FSDP; {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BURST_BENCH_DIR")) as folder:
        res = spawn(_rank, a.world, args=(cfg, folder), timeout_s=3600)
    print(f"{'format':>8} {'call':>5} {'seconds':>8} {'rank 0 GiB':>11} {'others GiB':>11}")
    for key in res[0]:
        sec = max(r[key][0] for r in res)
        r0 = res[0][key][1] / 2**30
        others = max((r[key][1] for r in res[1:]), default=0) / 2**30
        print(f"{key[0]:>8} {key[1]:>5} {sec:>8.2f} {r0:>11.2f} {others:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
