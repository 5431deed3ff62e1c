"""``burst-bench``: list, run, show and compare sweeps; regenerate figures; simulate.

    burst-bench list
    burst-bench run smoke                                   # suites/specs/smoke.toml, inline
    burst-bench run paper_main_14b --executor dry-run       # sbatch scripts + GPU-hours
    burst-bench run paper_main_14b --executor slurm --partition gpu --account proj --time 90
    burst-bench show results/smoke                          # latest run of a sweep
    burst-bench compare results/smoke/<run-a> results/smoke/<run-b>
    burst-bench figures [args]                              # paper_figures.make
    burst-bench simulate [args]                             # suites.simulate
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

from results.store import RunLockedError

__all__ = ["main"]

def _cmd_list(args) -> int:
    from suites.cells import expand
    from suites.spec import SPEC_DIR, SpecError, load_spec

    folder = Path(args.dir) if args.dir else SPEC_DIR
    if not folder.is_dir():
        raise ValueError(f"--dir {folder}: " + ("a file, not a folder" if folder.exists()
                                                else "no such folder"))
    ref = "<name>" if folder == SPEC_DIR else f"{folder}/<name>.toml"  # how `run` finds it
    paths = sorted(folder.glob("*.toml"))
    if not paths:
        raise ValueError(f"--dir {folder}: no spec file (*.toml) in it")
    print(f"sweeps in {folder} (burst-bench run {ref}):")
    for path in paths:
        name = path.stem if folder == SPEC_DIR else str(path)
        try:
            spec = load_spec(path)
        except SpecError as e:
            print(f"  {path.stem:<22} INVALID: {len(e.problems)} problem(s); "
                  f"`burst-bench run {name} --executor dry-run` lists them")
            continue
        cells = expand(spec)
        worlds = sorted({s.world for s in spec.scales})
        print(f"  {path.stem:<22} {spec.workload:<10} {spec.device:<4} {len(cells):>3} cells, "
              f"{len(spec.methods)} methods, world {'/'.join(map(str, worlds))}: "
              f"{spec.description}")
    return 0


class _PipeSafe:
    """stdout for a sweep: a reader that goes away (`burst-bench run ... | head`) silences the
    output, never the sweep (its rows are the point)."""

    def __init__(self, stream):
        self.stream, self.gone = stream, False

    def _guard(self, fn, *a):
        if not self.gone:
            try:
                return fn(*a)
            except BrokenPipeError:
                self.gone = True  # and the interpreter's final flush must not fail either
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        return None

    def write(self, text: str) -> int:
        self._guard(self.stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._guard(self.stream.flush)

    def __getattr__(self, name):  # encoding, fileno, isatty, ...: tqdm sizes its bar by them
        return getattr(self.stream, name)


def _cmd_run(args) -> int:
    with contextlib.redirect_stdout(_PipeSafe(sys.stdout)):
        return _run(args)


def _run(args) -> int:
    from suites.run import replace_slurm, run_sweep
    from suites.spec import load_spec

    for flag, folder in (("--out", args.out), ("--job-folder", args.job_folder)):
        if folder is not None and Path(folder).exists() and not Path(folder).is_dir():
            raise ValueError(f"{flag} {folder} is a file, not a folder")
    if args.new and args.retry_failed:
        raise ValueError("--retry-failed reruns the failed cells of an earlier run; a --new run "
                         "has none: use one or the other")
    spec = load_spec(args.spec)
    if args.data_parallel is not None:
        spec = spec.with_data_parallel(args.data_parallel)
    slurm = replace_slurm(spec.slurm, partition=args.partition, account=args.account,
                          time_min=args.time, constraint=args.constraint, qos=args.qos)
    given = [f"--{k}" for k in ("partition", "account", "time", "constraint", "qos")
             if getattr(args, k) is not None]
    if given and args.executor in ("inline", "local"):
        print(f"note: {', '.join(given)} apply to SLURM jobs only; the {args.executor} executor "
              "ignores them (its limit per cell is the spec's timeout_min)", file=sys.stderr)
    if args.job_folder is not None and args.executor == "inline":
        print("note: --job-folder holds the local and slurm executors' jobs; the inline "
              "executor runs in this process and ignores it", file=sys.stderr)
    res = run_sweep(spec, executor=args.executor, out=args.out, run_id=args.run_id,
                    new=args.new, retry_failed=args.retry_failed, slurm=slurm,
                    job_folder=args.job_folder, stream=sys.stdout, hardware=args.hardware)
    if res.run_dir is not None:
        print(f"rows: {res.run_dir / 'rows.jsonl'}\ntable: {res.run_dir / 'table.parquet'} "
              f"(and table.csv)")
        # a cell that failed or hung is not a result (oom and skipped are: the cell cannot run)
        status = res.table["status"]
        if len(status) and not (status == "ok").any():
            counts = ", ".join(f"{n} {st}" for st, n in status.value_counts().items())
            print(f"nothing was measured: no cell of {len(status)} ran to a number ({counts})",
                  file=sys.stderr)
            if (status == "skipped").all():  # nothing ran at all: not a result of this run
                return 1
        return 1 if status.isin(("error", "timeout")).any() else 0
    return 0


RAW_COLUMNS = ("label,seq_len,world,status,time_s,tokens_per_s,bytes_sent_forward,"
               "bytes_sent_backward,saved_bytes,max_err")


def _cmd_show(args) -> int:
    from results import store
    from results.tables import render
    from suites.run import summary_text

    newest = _newest_without_rows(Path(args.results))
    if newest is not None and (newest == Path(args.results)  # nothing else to show
                               or store.latest_run(args.results, with_rows=True) is None):
        print(_newest_note(newest))
        return 0
    shaped = [f"--{k}" for k in ("metric", "baseline") if getattr(args, k) is not None]
    if args.raw and shaped:
        raise ValueError(f"{' and '.join(shaped)} shape{'s' * (len(shaped) == 1)} the summary; "
                         "--raw prints columns (--columns) instead: use one or the other")
    if args.columns is not None and not args.raw:
        raise ValueError("--columns picks the columns of --raw; add --raw")
    df = store.load(args.results)
    path = Path(args.results)  # the run folder, or the folder of a run's file
    if path.is_file():
        path = path.parent
    run = path if (path / store.META).exists() else (
        store.latest_run(path, with_rows=True) if path.is_dir() else None)
    meta = store.read_meta(run) if run else {}
    if args.raw:
        columns = (args.columns or RAW_COLUMNS).split(",")
        cols = [c for c in columns if c in df.columns]
        unknown = [c for c in columns if c not in df.columns]
        if unknown:
            raise ValueError(f"--columns: no column {', '.join(map(repr, unknown))}; the row "
                             "schema is in results/README.md")
        print(render(df[cols]))
        _note_missing(df, run, meta)
        return 0
    baseline = args.baseline
    if baseline is None:  # the spec's
        baseline = meta.get("baseline")
    metrics = tuple(args.metric) if args.metric else None
    _check_metrics(metrics or ())
    if baseline is not None and args.baseline and baseline not in set(df["label"]):
        raise ValueError(f"--baseline {baseline!r} is not a label of these rows; labels: "
                         f"{', '.join(sorted(map(str, set(df['label']))))}")
    print(summary_text(df, baseline=baseline, metrics=metrics))
    if newest is not None:  # the sweep folder's latest run has no row: the table is an older one
        print(f"shown: run {run.name}; " + _newest_note(newest))
    elif run is not None and run != path and len(runs := store.runs_by_time(path)) > 1:
        print(f"shown: run {run.name}, the latest created of {len(runs)} runs in {path} "
              f"(another: burst-bench show {path}/<run id>)")
    _note_missing(df, run, meta)
    return 0


def _note_missing(df, run: Path | None, meta: dict) -> None:
    """The cells of the run that have no row, named (an interrupted run looked complete),
    and the command that resumes it."""
    if "cell_id" not in df:
        return
    have = set(df["cell_id"])
    missing = [c for c in meta.get("cells", []) if c not in have]
    if missing:
        names = ", ".join(missing[:5]) + (f", ... ({len(missing) - 5} more)"
                                          if len(missing) > 5 else "")
        print(f"{len(missing)} of {len(meta['cells'])} cells of run {run.name} have no row "
              f"(interrupted, or still running): {names}; `{_resume_command(run, meta)}` "
              "resumes it")


def _resume_command(run: Path, meta: dict) -> str:
    """The command that resumes ``run`` from here: its spec as the run recorded it (a shipped
    spec by its name, another relative to this folder), the results folder it was written
    into (<out>/<sweep>/<run id>) and its id."""
    spec = " ".join([_spec_argument(meta.get("source")), *meta.get("source_args", [])])
    return f"burst-bench run {spec} --out {run.parent.parent} --run-id {run.name}"


def _spec_argument(source: str | None) -> str:
    """run.json's ``source`` (relative to the repository when inside it) as an argument that
    works from the current folder."""
    from suites.spec import SPEC_DIR

    if not source:
        return "<its spec>"
    path = Path(source)
    if path.is_absolute() or path.exists():
        return source
    inside = SPEC_DIR.parent.parent / path
    if inside.parent == SPEC_DIR and not Path(inside.stem).exists():
        return inside.stem  # `burst-bench run <name>` finds it (unless a folder shadows it)
    return os.path.relpath(inside) if inside.exists() else source


def _newest_without_rows(path: Path) -> Path | None:
    """The run folder ``path``, or the latest run of the sweep folder ``path``, if it has no
    row yet (it died before its first cell ended, or its jobs are still queued)."""
    from results import store

    run = path if (path / store.META).exists() else (
        store.latest_run(path) if path.is_dir() else None)
    if run is None or store.has_rows(run) or store.table_has_rows(run):
        return None
    return run


def _newest_note(run: Path) -> str:
    from results import store
    from suites.executors import pending_jobs

    meta = store.read_meta(run)
    cells = len(meta.get("cells", []))
    jobs = len(pending_jobs(run, "slurm")) + len(pending_jobs(run, "local"))
    return (f"run {run.name} has no row yet ({cells} cells, {jobs} with submitted jobs not yet "
            f"collected): `{_resume_command(run, meta)}` collects and resumes it")


def _check_metrics(metrics) -> None:
    from results.tables import METRICS

    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"--metric: unknown {', '.join(map(repr, unknown))}; valid: "
                         f"{', '.join(METRICS)}")


def _made_by(df) -> str:
    """The commits and machines a table's rows come from, in a few words."""
    def values(col, chars=None):
        got = sorted({str(v)[:chars] for v in df[col].dropna()}) if col in df else []
        return ", ".join(got) or "unknown"
    return f"commit {values('git_commit', 8)} on {values('hostname')}"


def _cmd_compare(args) -> int:
    from results import store
    from results.tables import METRICS, compare, no_match_reason, only_in_b, regressions, render

    _check_metrics((args.metric,))
    if args.out and Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a folder; give the path of the CSV to write")
    if args.out and not Path(args.out).parent.is_dir():  # before the comparison, not after it
        raise ValueError(f"--out {args.out}: no folder {Path(args.out).parent}")
    if args.fail_above is not None and not (args.fail_above >= 0 and args.fail_above < math.inf):
        raise ValueError(f"--fail-above {args.fail_above:g}: give a percentage >= 0")

    a, b = store.load(args.a), store.load(args.b)
    names = tuple(args.names.split(",")) if args.names else ("a", "b")
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise ValueError(f"--names {args.names!r}: give two different names, e.g. cpu,gpu")
    df = compare(a, b, args.metric, names=names)
    if df.empty or (df[f"status_{names[1]}"] == "missing").all():
        print(no_match_reason(a, b, names))
        return 1
    varying = [c for c in ("label", "model", "seq_len", "world", "nodes", "dtype", "device")
               if c in df.columns and (c == "label" or df[c].astype(str).nunique() > 1)]
    heading, scale = METRICS[args.metric][:2]
    unit = heading[heading.rfind("(") + 1:-1] if heading.endswith(")") and scale != 1 else ""
    show = df[[*varying]].copy()
    for n in names:  # the values as the title's unit says (time_s in ms), and the heading too;
        # a side that did not succeed shows its status, not the time of a failed (or wrong) run
        show[f"{args.metric} ({unit}) {n}" if unit else f"{args.metric} {n}"] = [
            st if st != "ok" else None if v is None or v != v else float(v) * scale
            for v, st in zip(df[f"{args.metric}_{n}"], df[f"status_{n}"], strict=True)]
    show[f"ratio {names[1]}/{names[0]}"] = df["ratio"]
    show["speedup"] = df["speedup"]
    for n in names:
        if df[f"spread_{n}"].notna().any():
            show[f"spread {n}"] = df[f"spread_{n}"]
    spread = ("; spread = (max - min) / median over repeats"
              if any(c.startswith("spread ") for c in show.columns) else "")
    print(render(show, title=f"{METRICS[args.metric][0]}: {args.a} (a) vs {args.b} (b); "
                             f"speedup = how many times better b is{spread}"))
    for n, path in zip(names, (args.a, args.b), strict=True):  # which run of a sweep folder
        p = Path(path)
        if p.is_dir() and not (p / store.ROWS).exists() and not (p / store.TABLE).exists():
            print(f"note: {n} is {store.latest_run(p, with_rows=True)}, the latest run of "
                  f"{path} with rows")
    new = only_in_b(a, b)
    if len(new):  # cells b ran that a did not: listed, though not compared
        cells = ", ".join(f"{r.get('label')} {r.get('seq_len')}"
                          for _, r in new.head(5).iterrows())
        print(f"note: {len(new)} cell(s) of {names[1]} have no match in {names[0]} and are not "
              f"compared: {cells}{', ...' if len(new) > 5 else ''}")
    made = [_made_by(t) for t in (a, b)]
    if made[0] != made[1]:  # another commit or machine: the ratio is not the code's alone
        print(f"note: {names[0]} comes from {made[0]}, {names[1]} from {made[1]}")
    setup = df[df["differs"] != ""]
    if len(setup):  # a label given by hand matched cells run with other options
        cells = ", ".join(f"{r['label']} {r['seq_len']} ({r['differs'].replace(',', ', ')})"
                          for _, r in setup.head(5).iterrows())
        print(f"note: {len(setup)} matched cell(s) were run differently in {names[0]} and "
              f"{names[1]}: {cells}{', ...' if len(setup) > 5 else ''}; their ratio is not the "
              "code's alone")
    if args.out:
        df.to_csv(args.out, index=False)
        print(f"written {args.out}")
    if args.fail_above is None:
        return 0
    bad = regressions(df, args.fail_above / 100, args.metric)
    if bad.empty:
        print(f"no cell regressed by more than {args.fail_above:g}% in {args.metric}")
        return 0
    print(f"{len(bad)} cell(s) regressed by more than {args.fail_above:g}% in {args.metric} "
          "(or stopped succeeding, or lost the value):")
    print(render(bad[[*varying, "speedup", f"status_{names[0]}", f"status_{names[1]}"]]))
    return 1


def _figures(argv: list[str]) -> int:
    from paper_figures.make import main  # imported when asked for (it loads matplotlib)

    return int(main(argv) or 0)


def _simulate(argv: list[str]) -> int:
    from suites.simulate import main

    return int(main(argv) or 0)


def _parser() -> argparse.ArgumentParser:
    from suites.executors import EXECUTORS
    from suites.run import DEFAULT_OUT

    p = argparse.ArgumentParser(prog="burst-bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("list", help="list the sweeps in suites/specs")
    s.add_argument("--dir", help="another folder of spec files")
    s.set_defaults(fn=_cmd_list)

    s = sub.add_parser("run", help="run (or resume) a sweep")
    s.add_argument("spec", help="spec file, or a name in suites/specs (smoke, cpu_scaling, ...)")
    s.add_argument("--executor", default="inline", choices=EXECUTORS,
                   help="inline: local ranks spawned here (default); local: submitit's local "
                        "executor, a job per cell; slurm: job arrays through submitit; "
                        "dry-run: job scripts and GPU-hours, nothing runs")
    s.add_argument("--out", default=str(DEFAULT_OUT), help="results root (default: results/)")
    s.add_argument("--run-id", help="write (or resume) this run folder")
    s.add_argument("--new", action="store_true", help="start a new run (default: resume the "
                   "latest run of this spec, skipping its done cells)")
    s.add_argument("--data-parallel", default=None, metavar="{ddp,fsdp_world}",
                   help="train_step specs: run every method under the engine's data_parallel "
                        "(fsdp_world: its states sharded over every GPU as ZeRO-3, as the "
                        "paper's systems run); rows go to sweep <name>-<value>")
    s.add_argument("--retry-failed", action="store_true",
                   help="re-run oom/timeout/error and skipped cells")
    s.add_argument("--hardware", metavar="PROFILE",
                   help="with --executor dry-run: the simulator's time and memory of each GPU "
                        "cell on this profile (a800, a100, h100, h200 or a .toml path), and "
                        "the cells it predicts out of memory")
    g = s.add_argument_group("SLURM (override the spec's [slurm] table)")
    g.add_argument("--partition")
    g.add_argument("--account")
    g.add_argument("--time", type=_minutes, help="time limit per cell in minutes (>= 3)")
    g.add_argument("--constraint")
    g.add_argument("--qos")
    g.add_argument("--job-folder", help="submitit folder (shared filesystem; default: "
                   "<run>/jobs)")
    s.set_defaults(fn=_cmd_run)

    s = sub.add_parser("show", help="print a results table (methods side by side)")
    s.add_argument("results", help="run folder, sweep folder (latest run), rows.jsonl, "
                   ".parquet or .csv")
    s.add_argument("--metric", action="append", help="time_s, tokens_per_s, attn_tflops, "
                   "bytes_sent, max_err, ... (repeatable)")
    s.add_argument("--baseline", help="label to compute speedups against (default: the "
                   "spec's)")
    s.add_argument("--raw", action="store_true", help="print raw columns instead")
    s.add_argument("--columns", help="with --raw: the columns (default: " + RAW_COLUMNS + ")")
    s.set_defaults(fn=_cmd_show)

    s = sub.add_parser("compare", help="compare two result sets cell by cell")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--metric", default="time_s",
                   help="the column compared (default time_s); e.g. max_err, bytes_sent, "
                   "tokens_per_s, mem_peak_bytes")
    s.add_argument("--names", help="names of the two sets, e.g. before,after")
    s.add_argument("--out", help="also write the comparison as CSV")
    s.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 when a matched cell is worse in b by more than PCT percent, "
                   "failed, is missing or lost its value (exit 2 when no cell has the metric in "
                   "both); choose PCT above the measured run-to-run spread (docs/regressions.md). "
                   "With or without it, two sets without a matching cell exit 1")
    s.set_defaults(fn=_cmd_compare)

    s = sub.add_parser("figures", help="regenerate the papers' figures (paper_figures)",
                       add_help=False)
    s.set_defaults(fn=lambda a: _figures(a.rest))

    s = sub.add_parser("simulate", help="predict a sweep at paper scale (suites.simulate)",
                       add_help=False)
    s.set_defaults(fn=lambda a: _simulate(a.rest))
    return p


def _minutes(text: str) -> int:
    """--time: a whole number of minutes >= SLURM_MIN_TIME_MIN (SLURM reads --time=0 as no
    limit at all, and below 3 minutes submitit's warning signal ends the job at its start)."""
    from suites.spec import SLURM_MIN_TIME_MIN

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < SLURM_MIN_TIME_MIN:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time limit: give whole minutes >= "
                                         f"{SLURM_MIN_TIME_MIN}")
    return value


def main(argv: list[str] | None = None) -> int:
    from burst.spawn import interrupt_on_termination

    try:  # SIGTERM, SIGHUP: as Ctrl-C
        with interrupt_on_termination(), _terse_warnings():
            return _main(argv)
    except KeyboardInterrupt as e:  # Ctrl-C: what was written stays (run says where and how
        if not getattr(e, "reported", False):  # to resume), no traceback
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                print(f"burst-bench: interrupted{f' ({e})' if str(e) else ''}", file=sys.stderr)
        return 130


@contextlib.contextmanager
def _terse_warnings():
    """A warning on the command line as one line, ``warning: <text>`` (not the file and line
    of the code that warned, which a user of the command has no use for)."""
    def terse(message, category, *_, **__):
        kind = "warning" if category is UserWarning else category.__name__
        return f"{kind}: {message}\n"

    saved, warnings.formatwarning = warnings.formatwarning, terse
    try:
        yield
    finally:
        warnings.formatwarning = saved


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # methods given as import paths (package.module:function) resolve from the current
    # directory, as with `python -m` (a console script's path starts at its own folder)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    p = _parser()
    if argv and argv[0] in ("figures", "simulate"):  # everything after goes to the tool
        args = p.parse_args(argv[:1])
        args.rest = argv[1:]
    else:
        args, extra = p.parse_known_args(argv)
        if extra:  # the subcommand's usage (argparse's top-level one hides its options)
            sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
            sub.choices[args.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    if (args.cmd in ("list", "show", "compare") and hasattr(signal, "SIGPIPE")
            and threading.current_thread() is threading.main_thread()):
        # `burst-bench show ... | head` ends quietly (not `run`: a sweep must not die with it)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return args.fn(args)
    except ValueError as e:  # user errors (spec problems, bad paths): the message, no traceback
        print(f"burst-bench {args.cmd}: {e}", file=sys.stderr)
        return 2
    except RunLockedError as e:  # another driver runs this sweep: nothing to do here
        print(f"burst-bench {args.cmd}: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full or read-only disk: what, where; rows already written stay
        where = f" ({e.filename})" if e.filename else ""
        then = ""
        if args.cmd == "run":  # (a file or folder removed meanwhile: its rows went with it)
            then = ("; rows written before it are kept and a rerun resumes"
                    if e.errno != errno.ENOENT else "; a rerun measures the cells whose rows "
                    "are not there")
        print(f"burst-bench {args.cmd}: {e.strerror or e}{where}{then}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
