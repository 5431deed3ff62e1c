"""Where sweep results live on disk, and how they are written so that no row is lost or doubled.

Layout (one folder per sweep run)::

    results/<sweep>/<run_id>/run.json      the sweep spec, its hash and the cell ids (written once)
    results/<sweep>/<run_id>/rows.jsonl    raw rows, one JSON object per line, append-only
    results/<sweep>/<run_id>/table.parquet consolidated tidy table (one row per cell, schema order)
    results/<sweep>/<run_id>/table.csv     the same table as CSV

Append protocol (issue 5: a killed run never loses or duplicates a row):
- one row = one ``os.write`` of a complete line on a descriptor opened with O_APPEND, then fsync;
- a reader ignores a last line without its newline or that does not parse (a torn write);
- before the next append the writer cuts such a torn tail off (``repair``), so the half row can
  never be glued to the next one; the cell it belonged to has no row and simply runs again.
Only one sweep driver writes a run folder at a time (``RunLock``, an flock released by the kernel
when the holder dies), so a resumed run never races a still-running one.

``load`` reads any of these (a run folder, a sweep folder = its latest run, rows.jsonl, parquet,
csv) into a pandas DataFrame; ``consolidate`` keeps the last row per cell and writes the tables.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import sys
from pathlib import Path

from results.schema import COLUMNS

__all__ = [
    "RunLock",
    "append_row",
    "consolidate",
    "created_stamp",
    "drop_tables",
    "has_rows",
    "latest_run",
    "RunLockedError",
    "load",
    "replace_text",
    "new_run_id",
    "read_meta",
    "read_rows",
    "repair",
    "runs_by_time",
    "write_meta",
]

ROWS = "rows.jsonl"
META = "run.json"
TABLE = "table.parquet"
CSV = "table.csv"


def new_run_id(now: _dt.datetime | None = None) -> str:
    """A sortable run id: UTC time to the second plus the process id (unique on one host)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{os.getpid()}"


# ---------------------------------------------------------------------------------------------
# Rows: atomic appends, torn-tail tolerant reads


def repair(path: str | os.PathLike) -> int:
    """Cut a torn last line off ``path`` (not valid JSON, with or without its newline: what
    ``read_rows`` ignores); return the bytes removed. A last line that is whole JSON without
    its newline (an editor's save) is a row ``read_rows`` reads: it gets its newline back."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        content_end = size - 1 if f.read(1) == b"\n" else size
        # scan back for the newline before the last line; rows are small, read in blocks
        pos, start = content_end, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            i = f.read(min(step, content_end - pos)).rfind(b"\n")
            if i >= 0:
                start = pos + i + 1
                break
        f.seek(start)
        last = f.read()
        if not last.strip() or _valid_json(last):
            if not last.endswith(b"\n"):  # a prefix of a row is never valid JSON: it is whole
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
            return 0
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
        return size - start


def _valid_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8 (a torn multibyte char)
        return False
    return True


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Append one row as one complete line, durably (write + fsync)."""
    line = (json.dumps(row, sort_keys=False, default=_json_default) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(line)
        while view:  # a regular-file write is complete unless the disk is full; loop anyway
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except OSError as e:  # a full disk: os.write's error names no file; say which
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        os.close(fd)


ROW_KEYS = ("cell_id", "status")


def read_rows(path: str | os.PathLike, offset: int = 0, *,
              keys: tuple[str, ...] = ROW_KEYS) -> list[dict]:
    """Every complete row of a rows.jsonl file (from byte ``offset``, a line start); a torn
    last line is ignored; a line that is not an object with ``keys`` is an error naming it."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    lines = data.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
            if i == last:  # the last line (with or without its newline): a torn write
                continue
            raise ValueError(f"{path}: line {i + 1} is not valid JSON (not the last line, so "
                             "not a torn write); fix or remove it") from None
        if not isinstance(row, dict) or not all(row.get(k) for k in keys):
            raise ValueError(f"{path}: line {i + 1} is not a record of this file (an object "
                             f"with {' and '.join(keys)}, results/README.md); fix or remove it")
        out.append(row)
    return out


def _json_default(x):
    if hasattr(x, "item"):  # numpy / torch scalars
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


# ---------------------------------------------------------------------------------------------
# Run folders


class RunLockedError(RuntimeError):
    """Another driver holds the run folder (the CLI reports it as a user error)."""


def _locked(path: Path, *, wait: bool) -> int:
    """An open descriptor of ``path`` (made, with its folders, if missing) that holds its
    exclusive flock; without ``wait``, BlockingIOError when another holds it. A lock on a file
    that its holder removed meanwhile (scripts/train.py removes the folder of a run it refused;
    ``SweepLock`` a folder it made for nothing) holds nothing: the file there now is taken."""
    vanished = 0
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder removed in between by a lock that made it for
            vanished += 1  # nothing (SweepLock.release of a driver started at the same moment:
            if vanished > 100:  # FileNotFoundError, or "cannot write the sweep folder", in 1
                raise  # of ~20 runs of the two-driver test): made again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):
            here, mine = os.stat(path), os.fstat(fd)
            if (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class RunLock:
    """Exclusive lock on a run folder for the lifetime of one sweep driver."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / ".lock"
        self._fd = None

    def __enter__(self):
        try:
            self._fd = _locked(self.path, wait=False)
        except BlockingIOError:
            raise RunLockedError(f"{self.path.parent} is being written by another running "
                                 "sweep; wait for it, or pass --new for a separate run (on the "
                                 "same machine the two would share its cores, and time each "
                                 "other)") from None
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        return False


class SweepLock:
    """Held while a driver chooses its run folder in a sweep folder and claims it (takes its
    ``RunLock`` and writes its run.json), then ``release``d: a second driver started at the
    same moment waits here, then finds that run (and is refused by its lock), where both
    started a new run of their own and timed each other on the same cores. A sweep folder
    made for the lock alone (a run refused before it made its own folder) is removed again."""

    def __init__(self, sweep_dir: str | os.PathLike):
        self.path = Path(sweep_dir) / ".lock"
        self._fd, self._made = None, []

    def __enter__(self):
        # the folders the lock makes, innermost first (removed again if nothing else used them)
        self._made = [p for p in (self.path.parent, *self.path.parent.absolute().parents)
                      if not p.exists()]
        self._fd = _locked(self.path, wait=True)  # a choice takes milliseconds: wait for it
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:  # removed while held: a driver waiting on it then takes the file made anew
            if self._made and [p.name for p in self.path.parent.iterdir()] == [".lock"]:
                self.path.unlink()
                for folder in self._made:
                    folder.rmdir()
        except OSError:  # another driver's folder appeared, or the disk is gone: kept
            pass
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __exit__(self, *exc):
        self.release()
        return False


def replace_text(path: str | os.PathLike, text: str) -> None:
    """``path`` replaced whole by ``text``, durably: written beside it (``<name>.tmp``), synced
    and renamed, so a crash leaves the old file or the new one, and a write that fails (a full
    disk) leaves the old one and no temporary file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_meta(run_dir: str | os.PathLike, meta: dict) -> None:
    """run.json, replaced whole and durably (``replace_text``)."""
    replace_text(Path(run_dir) / META, json.dumps(meta, indent=1, default=_json_default) + "\n")


def read_meta(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / META
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a run's metadata ({e}); fix or remove it (or its run "
                         "folder)") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a run's metadata (a JSON {type(meta).__name__}, not an "
                         "object); fix or remove it (or its run folder)")
    return meta


def created_stamp(when: _dt.datetime | None = None) -> str:
    """run.json's "created": UTC to the second, in the one form ``runs_by_time`` sorts."""
    return f"{when or _dt.datetime.now(_dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}"


def runs_by_time(sweep_dir: str | os.PathLike) -> list[Path]:
    """The run folders of a sweep folder, oldest first: by their run.json "created", else by
    the folder's modification time (a named --run-id does not sort by its name); the name
    breaks ties."""
    def when(p: Path) -> tuple[str, str]:
        created = read_meta(p).get("created")
        if not created:
            created = created_stamp(_dt.datetime.fromtimestamp(p.stat().st_mtime,
                                                                _dt.timezone.utc))
        return created, p.name

    runs = []
    for p in Path(sweep_dir).iterdir():
        if not ((p / META).exists() or (p / ROWS).exists()):
            continue
        try:  # one broken run.json must not block every run of the sweep: named, left out
            runs.append((when(p), p))
        except ValueError as e:
            if (str(p), str(e)) not in _WARNED:  # once a process (a run reads the sweep twice)
                _WARNED.add((str(p), str(e)))
                print(f"warning: skipped run {p.name}: {e}", file=sys.stderr)
    return [p for _, p in sorted(runs)]


_WARNED: set[tuple[str, str]] = set()


def has_rows(run: Path) -> bool:
    """A complete row in the run's rows file (a torn first row, or a file cut to 0, is none)."""
    try:
        return bool(read_rows(run / ROWS))
    except ValueError:  # malformed: a run with rows, whose reader will say what is wrong
        return True


def latest_run(sweep_dir: str | os.PathLike, *, with_rows: bool = False) -> Path | None:
    """The most recent run folder of a sweep folder (``runs_by_time``), or None; ``with_rows``:
    the most recent that has rows (the newest may still be on its first cell, or have died
    before one)."""
    runs = [r for r in runs_by_time(sweep_dir)
            if not with_rows or has_rows(r) or table_has_rows(r)]
    return runs[-1] if runs else None


def table_has_rows(run: Path) -> bool:
    """A row in the run's table (a run kept as its table alone has no rows file); the empty
    table of a run that died before its first row is none."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(run / TABLE).metadata.num_rows > 0
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # malformed: its reader will say what is wrong
        return True


# ---------------------------------------------------------------------------------------------
# Tables


def _frame(rows: list[dict]):
    """The rows as a table; an integer past int64 (a simulated byte count of a model no GPU
    holds: its OOM row's allocated bytes) as a float there, the jsonl row keeping it exact
    (parquet's OverflowError broke the table after every row was written)."""
    import pandas as pd

    def fits(v) -> bool:
        return type(v) is not int or -(2**63) <= v < 2**63

    rows = [r if all(map(fits, r.values())) else
            {k: v if fits(v) else float(v) for k, v in r.items()} for r in rows]
    extra = sorted({k for r in rows for k in r} - set(COLUMNS))
    return pd.DataFrame(rows, columns=[*COLUMNS, *extra])


def _last_per_cell(rows: list[dict]) -> list[dict]:
    """One row per cell: the last one written (a retried failure replaces its error row)."""
    last: dict = {}
    for r in rows:
        last[r.get("cell_id") or id(r)] = r
    return list(last.values())


def consolidate(run_dir: str | os.PathLike, *, write: bool = True):
    """The tidy table of a run (one row per cell, schema column order); writes parquet + CSV,
    unless both exist and the CSV already holds this table (a finished run read again stays
    byte for byte as it was: parquet records the writing library's version)."""
    from results.tables import add_speedup

    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    rows = _last_per_cell(read_rows(run_dir / ROWS))
    order = {c: i for i, c in enumerate(meta.get("cells", []))}  # the sweep's cell order
    rows.sort(key=lambda r: order.get(r.get("cell_id"), len(order)))
    df = add_speedup(_frame(rows), meta.get("baseline"))
    csv = run_dir / CSV
    if write and (run_dir / TABLE).exists() and csv.exists() \
            and csv.read_text() == df.to_csv(index=False):
        write = False
    if write:
        for name, writer in ((TABLE, df.to_parquet), (CSV, df.to_csv)):
            tmp = run_dir / (name + ".tmp")
            try:
                writer(tmp, index=False)
                os.replace(tmp, run_dir / name)
            except BaseException:  # a full disk: no half-written table left behind
                tmp.unlink(missing_ok=True)
                raise
    return df


def drop_tables(run_dir: str | os.PathLike) -> None:
    """Remove a run's table files (before rows are added: ``consolidate`` writes them again),
    and any left half-written by a driver killed while it wrote them."""
    for name in (TABLE, CSV):
        for path in (Path(run_dir) / name, Path(run_dir) / (name + ".tmp")):
            path.unlink(missing_ok=True)


def load(path: str | os.PathLike):
    """A DataFrame from a run folder, a sweep folder (its latest run), rows.jsonl, .parquet or
    .csv. Raw rows files are deduplicated per cell like ``consolidate``."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        if not (path / ROWS).exists() and not (path / TABLE).exists():
            run = latest_run(path, with_rows=True)
            if run is None:
                raise ValueError(f"{path} holds no sweep run with rows (no complete row in a "
                                 f"{ROWS} in it or its subfolders)")
            path = run
        if (path / ROWS).exists():
            return _rows_table(consolidate(path, write=False), path / ROWS)
        return _rows_table(pd.read_parquet(path / TABLE), path / TABLE)
    if not path.exists():
        raise ValueError(f"{path} does not exist; give a run folder, a sweep folder, rows.jsonl, "
                         ".parquet or .csv")
    if path.name == ROWS:  # a run's rows: as its folder (cell order, speedups)
        return _rows_table(consolidate(path.parent, write=False), path)
    if path.suffix == ".jsonl":
        return _rows_table(_frame(_last_per_cell(read_rows(path))), path)
    try:  # pandas' and pyarrow's parse errors are ValueErrors that do not name the file
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        elif path.suffix == ".csv":  # an empty field is missing; a label "NA" stays a label
            df = pd.read_csv(path, keep_default_na=False, na_values=[""])
        else:
            df = None
    except ValueError as e:
        raise ValueError(f"{path}: not a readable {path.suffix[1:]} table ({e})") from None
    if df is None:
        raise ValueError(f"cannot read {path}: expected a folder, .jsonl, .parquet or .csv")
    return _rows_table(df, path)


# the columns every row has that the tables of show and compare are keyed by
_KEY_COLUMNS = ("label", "status", "seq_len", "world")


def _rows_table(df, path: Path):
    """``df`` if it is a table of result rows (results/README.md), else a ValueError that says
    what the file is not (another CSV, the output of ``compare``, the published numbers)."""
    missing = [c for c in _KEY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path} is not a table of result rows (no column "
                         f"{', '.join(map(repr, missing))}; the row schema is in "
                         "results/README.md): give a run folder, a sweep folder, its rows.jsonl, "
                         f"or the {CSV} / {TABLE} a run writes")
    import pandas as pd

    from results.tables import METRICS

    # a word among the numbers, or a negative time, count or size, named (a hand-edited row
    # was pandas' "'<' not supported between 'str' and 'int'" in show, without the file or
    # the column, or a -104x speedup)
    for c in ("seq_len", "world", *METRICS):
        if c not in df.columns:
            continue
        col = df[c]
        if not pd.api.types.is_numeric_dtype(col):  # a JSON string "1024" is no number either
            bad = (col.notna() & ~col.map(_is_number)).to_numpy()
            if bad.any():
                raise ValueError(f"{path}: column {c!r} holds {col[bad].iloc[0]!r} "
                                 f"({_which_row(df, bad)}), not a number")
            col = pd.to_numeric(col)
        bad = (col < 0).fillna(False).to_numpy(dtype=bool)
        if bad.any():
            raise ValueError(f"{path}: column {c!r} holds {df[c][bad].iloc[0]} "
                             f"({_which_row(df, bad)}), below 0")
    return df


def _is_number(x) -> bool:
    import numbers

    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _which_row(df, bad) -> str:
    """The first ``bad`` row, as a reader finds it: its cell and label where rows have them (a
    run's rows come out sorted, one per cell), else its line in the table."""
    import numpy as np

    i = int(np.flatnonzero(bad)[0])
    row = df.iloc[i]
    if "cell_id" in df.columns and isinstance(row["cell_id"], str):
        return f"cell {row['cell_id']}" + (f", label {row['label']!r}"
                                           if isinstance(row.get("label"), str) else "")
    return f"row {i + 1}"
