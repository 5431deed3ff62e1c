"""The longest sequence a cell fits, by the simulator: the planning question before a long run.

    fit = longest(cell, "a800")        # Longest: seq_len, row at it, and why not longer
    fits = longest_spec("paper_main_7b", "h100")

The search runs on a grid of ``unit`` tokens per rank (default 1024; any even number keeps every
layout's length rule): it doubles from one unit until a length is not ``ok``, then bisects,
asking each length whether it runs and fits (``predict(timing=False)``) and pricing the one it
finds in full. It assumes memory grows with the sequence, so that nothing fits past the first
length that does not (``tests/test_longest.py`` checks that on the paper's cells). The length
that ends the search says why in ``stop``: an ``oom`` (the usual end), or a length the code
cannot run, such as the model config's ``max_seq_len``; a cell that does not run at one unit
says that too.

Command line: ``burst-bench simulate SPEC --longest [--hardware h100] [--out DIR]`` (each
method and scale of the spec; its seq_lens are ignored). docs/simulator.md ("Longest sequence
that fits") has the paper's two training specs on the a800 profile.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from suites.hardware import Hardware, load
from suites.simulate import as_cell, predict, priced_cell

__all__ = ["Longest", "longest", "longest_spec", "longest_table"]

UNIT = 1024
"""Tokens per rank of the search grid."""
LIMIT = 1 << 34
"""No search goes past this many tokens (a cell whose memory would never run out)."""


@dataclass(frozen=True)
class Longest:
    cell: object
    """The cell searched (``suites.cells.Cell``), at its first grid length."""
    seq_len: int | None
    """The longest grid length whose prediction is ``ok``; None when not even one unit is."""
    row: dict
    """The simulated row at ``seq_len`` (at one unit per rank when ``seq_len`` is None)."""
    stop_len: int
    """The first grid length past ``seq_len`` (or the first one), which is not ``ok``."""
    stop: str
    """Why ``stop_len`` is not: its status and error."""
    prediction: object = None
    """``row``'s prediction (``suites.simulate.Prediction``; ``explain`` reads it)."""


def longest(cell, hardware: str | Hardware, *, unit: int = UNIT, ctx=None,
            invalid: str = "error") -> Longest:
    """The longest sequence, in steps of ``unit`` tokens per rank, that ``cell`` fits on
    ``hardware`` (its own ``seq_len`` is ignored). A length the code cannot run is an
    ``invalid`` row, as in ``suites.simulate.predict``."""
    hw = hardware if isinstance(hardware, Hardware) else load(hardware)
    if isinstance(unit, bool) or not isinstance(unit, int) or unit < 2 or unit % 2:
        raise ValueError(f"unit={unit!r}: expected an even number of tokens per rank >= 2 "
                         "(zigzag and selective_half split each rank's tokens in two)")
    if isinstance(cell, dict) and cell.get("seq_len") is None:  # its own is ignored anyway
        cell = {**cell, "seq_len": cell.get("world") or 1}
    first = as_cell(cell, hw.gpus_per_node)
    step = unit * first.world
    base = dataclasses.replace(first, seq_len=step)

    def search(timing: bool):
        """(last grid multiple that is ok or 0, first that is not, its prediction or None past
        the limit)."""
        def at(k: int):  # None past the search's limit
            if k * step > LIMIT:
                return None
            return predict(dataclasses.replace(base, seq_len=k * step), hw, invalid=invalid,
                           timing=timing)

        good, bad, why, k = 0, None, None, 1
        while bad is None:  # double until a length is not ok
            p = at(k)
            if p is not None and p.status == "ok":
                good, k = k, 2 * k
            else:
                bad, why = k, p
        while bad - good > 1:  # then bisect between the last ok and the first not
            mid = (good + bad) // 2
            p = at(mid)
            if p is not None and p.status == "ok":
                good = mid
            else:
                bad, why = mid, p
        return good, bad, why

    # whether a length runs and fits, without its time (a windowed ring plans its kernels'
    # tiles to time them: seconds a length at a million tokens per rank); the length found is
    # then priced whole, and searched again whole in the rare case that only its time is an
    # error
    for timing in (False, True):
        good, bad, why = search(timing)
        row, p = priced_cell(dataclasses.replace(base, seq_len=(good or 1) * step), hw,
                             ctx=ctx, invalid=invalid)
        if not good or p.status == "ok":
            break
    stop = (f"{why.status}: {why.error}" if why is not None
            else f"past the search limit of {LIMIT} tokens")
    return Longest(base, good * step if good else None, row, bad * step, stop, p)


def longest_spec(spec, hardware: str | Hardware, out_dir: str | Path | None = None,
                 *, unit: int = UNIT, on_fit=None) -> list[Longest]:
    """``longest`` for each method and scale of a spec (its seq_lens ignored; a method with
    ``skip_invalid`` gets ``skipped`` rows where it cannot run, as in a sweep). With
    ``out_dir`` the rows (at each longest length) are written as the run folder
    ``out_dir/<sweep>-longest/simulated-<hardware>/``. ``on_fit(fit)`` is called as each is
    found (the CLI's progress: each search prices many lengths)."""
    from suites.cells import expand
    from suites.provenance import code_provenance
    from suites.rows import RunContext
    from suites.simulate import run_id, write_rows
    from suites.spec import SweepSpec, load_spec

    sw = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    hw = hardware if isinstance(hardware, Hardware) else load(hardware)
    name = f"{sw.name}-longest"
    ctx = RunContext(run_id=run_id(hw), executor="simulate", sweep_spec=sw.to_json(),
                     **code_provenance())
    skip = {m.label for m in sw.methods if m.skip_invalid}
    out, seen = [], set()
    for c in expand(sw):
        key = (c.label, c.world, c.nodes)
        if key not in seen:
            seen.add(key)
            out.append(longest(dataclasses.replace(c, sweep=name), hw, unit=unit, ctx=ctx,
                               invalid="skipped" if c.label in skip else "error"))
            if on_fit is not None:
                on_fit(out[-1])
    if out_dir is not None:
        meta = {"sweep": name, "run_id": ctx.run_id, "source": sw.source, "spec": sw.to_json(),
                "baseline": sw.baseline, "cells": [f.row["cell_id"] for f in out],
                "executor": "simulate", "hardware": hw.name,
                "hardware_profile": hw.provenance(),
                "search": f"longest fit, grid of {unit} tokens per rank"}
        write_rows([f.row for f in out], Path(out_dir) / name / ctx.run_id, meta)
    return out


def _tokens(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**20:.2f}M ({n})"


def longest_table(fits: list[Longest]) -> str:
    """Markdown: one line per cell, the longest fit, its rate and memory, and why not longer."""
    lines = ["| method | model | GPUs | ckpt | longest fit | tokens/s per GPU | "
             "GiB reserved | next length on the grid |", "|" + "---|" * 8]
    for f in fits:
        r, c = f.row, f.cell
        rate = f"{r['tokens_per_s']:.1f}" if f.seq_len and r.get("tokens_per_s") else ""
        if f.seq_len and r.get("attn_tflops") and c.workload == "attention":
            rate = f"{r['attn_tflops']:.1f} TFLOP/s"
        mem = f"{r['mem_reserved_bytes'] / 2**30:.1f}" if f.seq_len else ""
        ckpt = c.checkpointing if c.workload == "train_step" else ""
        lines.append(f"| {c.label} | {c.model or ''} | {c.world} | {ckpt} | "
                     f"{_tokens(f.seq_len)} | {rate} | {mem} | "
                     f"{_tokens(f.stop_len)}: {f.stop.splitlines()[0]} |")
    return "\n".join(lines)
