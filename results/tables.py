"""Pure functions of result tables: speedup against a baseline, side-by-side summaries, the
comparison of two result sets, and plain-text rendering for the terminal.

Cells are matched on ``MATCH_KEYS`` (everything that defines a cell except the method), so a
speedup is always between two methods run on the same workload, shape, length and world; a
comparison of two result sets additionally matches the method ``label``.
"""

from __future__ import annotations

import json
import math

__all__ = ["MATCH_KEYS", "METRICS", "add_speedup", "compare", "compare_keys", "no_match_reason",
           "only_in_b", "regressions", "render", "seq_label", "summary"]

MATCH_KEYS = ("workload", "model", "seq_len", "batch", "heads", "kv_heads", "head_dim", "causal",
              "window", "dtype", "world", "nodes", "device")

SETUP_KEYS = ("method_options", "data_parallel", "model_config", "warmup", "repeats")
"""How a matched cell was run, beyond what matches it: ``compare`` notes a difference
(``data_parallel``, ``model_config``: a training step's, read from its ``spec``; the latter, a
model that a spec defines, whose name two different models can share)."""

# metric -> (heading, scale, format, higher is better); a scaled value's heading ends with its
# unit in parentheses (compare reads it from there)
METRICS: dict[str, tuple[str, float, str, bool]] = {
    "time_s": ("time per step (ms)", 1e3, "{:.1f}", False),
    "tokens_per_s": ("tokens/s per device", 1.0, "{:.0f}", True),
    "attn_tflops": ("attention TFLOP/s per device (kernel convention)", 1.0, "{:.3g}", True),
    "tflops_model_flops_causal": ("TFLOP/s per device (model_flops_causal)", 1.0, "{:.3g}", True),
    "mfu_model_flops_causal": ("MFU, model_flops_causal (%)", 100.0, "{:.1f}", True),
    "bytes_sent": ("sent per rank, busiest fwd + busiest bwd (MiB)", 2.0**-20, "{:.2f}", False),
    "bytes_sent_backward": ("sent per rank in backward (MiB)", 2.0**-20, "{:.2f}", False),
    "saved_bytes": ("saved for backward (MiB)", 2.0**-20, "{:.1f}", False),
    "mem_peak_bytes": ("peak memory (MiB)", 2.0**-20, "{:.1f}", False),
    "mem_reserved_bytes": ("reserved memory (MiB)", 2.0**-20, "{:.1f}", False),
    "max_err": ("max abs error vs float64 reference", 1.0, "{:.1e}", False),
    "max_err_ratio": ("max error over a plain same-dtype attention's", 1.0, "{:.2g}", False),
}


def seq_label(n) -> str:
    """A sequence length as tables and figures write it: 1M, 1536K, 1000 (exact, never
    rounded: 1.5M is 1536K)."""
    n = int(n)
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return f"{n >> 10}K" if n >= 1 << 10 and n % (1 << 10) == 0 else str(n)


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _key_value(v):
    """None for a missing value; a whole float as its int (a column with one empty value is
    float in pandas: its 1.0 is the other table's 1)."""
    if _missing(v):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _keys(df, cols) -> list[str]:
    """One hashable string per row for the given columns (None and NaN compare equal, and a
    whole float its int)."""
    cols = [c for c in cols if c in df.columns]
    out = []
    for vals in df[cols].itertuples(index=False, name=None):
        out.append(json.dumps([_key_value(v) for v in vals], default=str))
    return out


def _check_unique(df, what: str) -> None:
    """Refuse a table with two rows for one cell and label: whichever came last would silently
    stand for both (a table per run has one row per cell; retries keep the newest)."""
    seen: dict[str, int] = {}
    for i, k in enumerate(_keys(df, (*MATCH_KEYS, "label"))):
        if k in seen:
            raise ValueError(
                f"{what}: rows {seen[k]} and {i} are the same cell and label {k}; compare "
                "two result sets with `compare`, or give the methods distinct labels")
        seen[k] = i


def _from_spec(spec, workload) -> tuple[str | None, str | None]:
    """A training step's DP wrapper (none in the cell: the engine's default, ddp) and its
    spec-defined model's fields (canonical JSON; None: a named config) from its row's ``spec``
    (the cell); (None, None) for another workload or a row without a spec."""
    if workload != "train_step" or _missing(spec):
        return None, None
    try:
        cell = json.loads(spec)
        own = cell.get("model_config")
        return (cell.get("data_parallel") or "ddp",
                None if own is None else json.dumps(own, sort_keys=True))
    except (TypeError, ValueError, AttributeError):
        return None, None


def _with_derived(df):
    df = df.copy()
    if "bytes_sent" not in df.columns and "bytes_sent_forward" in df.columns:
        df["bytes_sent"] = df["bytes_sent_forward"].astype(float) + df[
            "bytes_sent_backward"].astype(float)
    if {"spec", "workload"} <= set(df.columns):
        got = [_from_spec(s, w) for s, w in zip(df["spec"], df["workload"], strict=True)]
        for i, k in enumerate(("data_parallel", "model_config")):
            if k not in df.columns:
                df[k] = [g[i] for g in got]
    return df


def add_speedup(df, baseline: str | None):
    """Fill ``speedup`` = baseline's time_s / this row's time_s for every cell whose matching
    baseline cell (same ``MATCH_KEYS`` and the same ``hardware``: a run resumed on another
    partition must not divide an H100's time by an A100's; label == baseline) succeeded."""
    df = df.copy()
    if not baseline or df.empty:
        return df
    _check_unique(df, "add_speedup")
    keys = _keys(df, (*MATCH_KEYS, "hardware"))
    base = {}
    for k, label, status, t in zip(keys, df["label"], df["status"], df["time_s"], strict=True):
        if label == baseline and status == "ok" and not _missing(t):
            base[k] = float(t)
    df["speedup"] = [base[k] / float(t) if k in base and not _missing(t) and s == "ok" else None
                     for k, t, s in zip(keys, df["time_s"], df["status"], strict=True)]
    return df


def _fmt(metric: str, value, status) -> str:
    if status not in (None, "ok") and not (isinstance(status, float) and math.isnan(status)):
        return str(status)
    if _missing(value):
        return "-"
    x = float(value) * METRICS[metric][1]
    text = METRICS[metric][2].format(x)
    # a small nonzero value (a simulated 20 us step) keeps two digits instead of reading 0.0
    return f"{x:.2g}" if x and float(text) == 0 else text


def summary(df, metric: str = "time_s", *, baseline: str | None = None):
    """Methods side by side: one row per cell (the MATCH_KEYS that vary), one column per label,
    the metric formatted, with ``(N.NNx)`` speedup against ``baseline`` for time_s."""
    import pandas as pd

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    _check_unique(df, "summary")
    df = _with_derived(df)
    if baseline:
        df = add_speedup(df, baseline)
    varying = [k for k in MATCH_KEYS if k in df.columns and df[k].astype(str).nunique() > 1]
    if not varying:
        varying = [k for k in ("seq_len",) if k in df.columns]
    labels = list(dict.fromkeys(df["label"]))
    keys = _keys(df, varying)
    table: dict[str, dict] = {}
    for key, (_, r) in zip(keys, df.iterrows(), strict=True):
        row = table.setdefault(key, {k: r[k] for k in varying})
        cell = _fmt(metric, r.get(metric), r.get("status"))
        sp = r.get("speedup")
        if metric == "time_s" and baseline and not _missing(sp):
            cell += f" ({float(sp):.2f}x)"
        row[r["label"]] = cell
    out = pd.DataFrame(list(table.values()), columns=[*varying, *labels]).fillna("")
    return out.sort_values(varying, kind="stable").reset_index(drop=True) if varying else out


def compare(a, b, metric: str = "time_s", *, names: tuple[str, str] = ("a", "b")):
    """Cells of table a (MATCH_KEYS + label) with the metric of each table, ``ratio`` = b / a
    and ``speedup`` = how many times better b is (a/b for times, b/a for rates). A cell of a
    that b lacks is a row with b's status ``missing`` (a gate must not pass a cell that
    vanished); cells only in b are new, not compared. ``differs`` names the ``SETUP_KEYS`` in
    which the two rows of a cell differ (a label given by hand stays when its options
    change)."""
    import pandas as pd

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    _check_unique(a, f"compare ({names[0]})")
    _check_unique(b, f"compare ({names[1]})")
    a, b = _with_derived(a), _with_derived(b)
    cols = compare_keys(a, b)
    index_b = {k: i for i, k in enumerate(_keys(b, cols))}
    rows = []
    for ka, (_, ra) in zip(_keys(a, cols), a.iterrows(), strict=True):
        rb = b.iloc[index_b[ka]] if ka in index_b else pd.Series({"status": "missing"})
        va, vb = ra.get(metric), rb.get(metric)
        ok = (ra.get("status") == "ok" and rb.get("status") == "ok" and not _missing(va)
              and not _missing(vb))
        ratio = speed = None
        if ok:  # a value that fell to 0, or rose from it, is compared too (it passed a gate)
            fa, fb = float(va), float(vb)
            ratio = fb / fa if fa else (1.0 if fb == 0 else math.inf)
            speed = ratio if METRICS[metric][3] else (1 / ratio if ratio else math.inf)
        rows.append({**{k: ra[k] for k in cols}, "differs": _setup_differs(ra, rb),
                     f"{metric}_{names[0]}": va,
                     f"{metric}_{names[1]}": vb, f"status_{names[0]}": ra.get("status"),
                     f"status_{names[1]}": rb.get("status"), "ratio": ratio, "speedup": speed,
                     f"spread_{names[0]}": _spread(ra, metric),
                     f"spread_{names[1]}": _spread(rb, metric)})
    return pd.DataFrame(rows)


def only_in_b(a, b):
    """The rows of b whose cell a lacks: new, not compared (``compare``)."""
    cols = compare_keys(a, b)
    seen = set(_keys(a, cols))
    return b[[k not in seen for k in _keys(b, cols)]]


def _setup_differs(ra, rb) -> str:
    """The ``SETUP_KEYS`` both rows have and differ in, comma-separated."""
    both = ((k, _key_value(ra.get(k)), _key_value(rb.get(k))) for k in SETUP_KEYS)
    return ",".join(k for k, x, y in both if x is not None and y is not None and x != y)


def compare_keys(a, b) -> list[str]:
    """The columns ``compare`` matches a cell of a with one of b on: ``MATCH_KEYS``, the
    training step's checkpointing and head (a spec edited in them keeps its labels, whose
    default names only the method and its options) and the ``label``, those both tables
    have."""
    return [k for k in (*MATCH_KEYS, "checkpointing", "fused_head", "label")
            if k in a.columns and k in b.columns]


def _values(df, col) -> list:
    return sorted({json.dumps(_key_value(v), default=str) for v in df[col]})


def no_match_reason(a, b, names: tuple[str, str] = ("a", "b")) -> str:
    """Why no cell of a has a match in b: a table with no rows, or the keys compared, and the
    ones whose values the two tables do not share where leaving those out would match cells (a
    measured CPU run against a simulation of its spec differs in ``device`` alone)."""
    empty = [n for n, df in zip(names, (a, b), strict=True) if df.empty]
    if empty:
        return (f"no matching cells: {' and '.join(empty)} "
                f"{'has' if len(empty) == 1 else 'have'} no rows")
    cols = compare_keys(a, b)
    msg = f"no matching cells (cells match on {', '.join(cols)})"
    apart = [k for k in cols if not set(_values(a, k)) & set(_values(b, k))]
    rest = [k for k in cols if k not in apart]
    if not apart or not rest or not set(_keys(a, rest)) & set(_keys(b, rest)):
        return msg
    said = "; ".join(f"{k}: {', '.join(_values(a, k))} in a, {', '.join(_values(b, k))} in b"
                     for k in apart)
    why = (" (a simulation's rows are device=cuda: compare it with a GPU run)"
           if "device" in apart else "")
    return (f"{msg}: the cells differ only in {', '.join(apart)} ({said}), so they are "
            f"different cells{why}")


def _spread(row, metric: str):
    """Run-to-run spread of a timed row: (slowest - fastest repeat) / median; None otherwise."""
    if metric != "time_s":
        return None
    lo, hi, med = row.get("time_s_min"), row.get("time_s_max"), row.get("time_s")
    if any(_missing(x) for x in (lo, hi, med)) or not float(med):
        return None
    return (float(hi) - float(lo)) / float(med)


def regressions(cmp, threshold: float, metric: str = "time_s"):
    """Rows of a ``compare`` table (of ``metric``) where b is worse than a by more than
    ``threshold`` (0.05 = 5%), where a cell that succeeded in a fails in b, or where b lost a's
    value (an ok row without it). A table in which no cell has the metric on both sides
    compares nothing: ValueError, not a pass."""
    names = [c[len("status_"):] for c in cmp.columns if c.startswith("status_")]
    va, vb = (cmp[f"{metric}_{n}"].map(_missing) for n in names)  # True where missing
    slower = cmp["speedup"].map(lambda s: not _missing(s) and float(s) < 1 / (1 + threshold))
    broke = (cmp[f"status_{names[0]}"] == "ok") & (cmp[f"status_{names[1]}"] != "ok")
    lost = (cmp[f"status_{names[1]}"] == "ok") & ~va & vb
    if len(cmp) and not (~va & ~vb).any() and not broke.any():
        raise ValueError(f"no cell has {metric!r} in both tables: nothing to compare")
    return cmp[slower | broke | lost]


def render(df, *, title: str | None = None, floatfmt: str = "{:.3g}") -> str:
    """A plain-text table (right-aligned numbers, left-aligned text) for the terminal."""
    def cell(v) -> str:
        if _missing(v):
            return "-"
        if isinstance(v, float):
            return floatfmt.format(v)
        return str(v)

    header = [str(c) for c in df.columns]
    body = [[cell(v) for v in row] for row in df.itertuples(index=False, name=None)]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(header)]
    numeric = [all(_is_num(r[i]) for r in body) for i in range(len(header))]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(vals, widths, numeric, strict=True)).rstrip()

    out = [title] if title else []
    out += [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in body]
    return "\n".join(out)


def _is_num(s: str) -> bool:
    try:
        float(s.split(" ")[0].rstrip("x"))
        return True
    except ValueError:
        return s == "-"
