"""Sharded training states: every rank writes and reads its own shards, nothing is gathered;
and the integrity checks both state formats share.

``Trainer.save(path, sharded=True)`` keeps the training state as torch.distributed.checkpoint
(DCP) folders: each rank writes the shards it holds (under FSDP its slices, so no rank holds
the whole state; a replicated weight once, by the rank DCP's planner picks), and a load on any
CP x DP layout and either DP wrapper reads back the slices its ranks need (DCP reshards). Every
rank must see the same folder (a shared filesystem across nodes).

On disk, two folders and a link::

    <path>            -> <name>.a   (a symbolic link: the last complete save)
    <name>.a/         .metadata, __<rank>_<i>.distcp (DCP's), info.pt (ours, written last)
    <name>.b/         the save before it: a whole fallback copy, overwritten by the next save

A save writes over the folder the link does not name, then replaces the link (``os.replace``,
after the folder's files and entries are on disk; for ``save(..., wait=False)`` at
``Trainer.finish_save``, after the background write): a run killed while saving keeps the last
good state whole (the one before it is lost: its folder was being written, and a load refuses
it, having no ``info.pt``). A load resolves the link once, on rank 0, and every rank reads that
folder. ``info.pt`` holds the caller's ``meta``, the optimizer's name, the hyperparameters of
an optimizer that had taken no step yet (its empty state is not saved: torch would fill it with
a zero-lr step), and a CRC-32 of every file DCP wrote; ``torch.save`` stores its own records'
CRC-32s. A load checks them all (``info.pt`` first, then each rank a share of DCP's files)
before anything else is unpickled: DCP keeps no checksums, and bit rot would resume, silently,
from wrong weights or another step.

Unlike the one-file state (read with ``torch.load(weights_only=True)``), DCP unpickles its
``.metadata`` and the optimizer's hyperparameters: load only sharded states you trust.
"""

from __future__ import annotations

import os
import shutil
import zipfile
import zlib
from pathlib import Path

import torch

from burst import comm

__all__ = ["INFO", "Changed", "check_zip_crcs", "crc_problems", "fallback", "gather_crcs",
           "is_sharded", "prepare", "publish", "read_info", "resolve", "save_with_crcs",
           "saved_weights", "target_folder", "writing"]

INFO = "info.pt"  # ours, beside DCP's files
_BUFFERS = ("a", "b")
_WRITING: set[str] = set()  # folders a save(..., wait=False) of this process still writes


def writing(folder: Path, busy: bool) -> None:
    """Mark ``folder`` as being written by a background save of this process (or no longer):
    ``target_folder`` refuses it to another save meanwhile."""
    (_WRITING.add if busy else _WRITING.discard)(str(Path(folder).resolve()))


class Changed(ValueError):
    """A state whose bytes changed after ``Trainer.save`` wrote it."""


def check_zip_crcs(path) -> None:
    """Raise ``Changed`` if a record of the zip file that ``torch.save`` wrote at ``path`` no
    longer matches its CRC-32 (each record read once; zipfile checks the CRC at its end). A
    record stored without one (CRC 0: torch's ``set_crc32_options(False)``) is not checked; a
    file that is no zip is left to ``torch.load``'s own error."""
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return
    except UnicodeDecodeError as e:  # a damaged index: a record name that is no UTF-8
        raise Changed(f"{path} was changed after Trainer.save wrote it: its zip index does not "
                      f"read ({e}); nothing was loaded (resume from another copy of the "
                      "state)") from None
    try:
        with z:
            for info in z.infolist():
                if info.CRC == 0 and info.file_size:  # written without a CRC
                    continue
                try:
                    with z.open(info) as f:
                        while f.read(1 << 24):
                            pass
                except zipfile.BadZipFile as e:
                    if "CRC" not in str(e):
                        raise
                    raise Changed(f"{path} was changed after Trainer.save wrote it: its record "
                                  f"{info.filename!r} fails its CRC-32 check; nothing was "
                                  "loaded (resume from another copy of the state)") from None
    except zipfile.BadZipFile:
        return


def save_with_crcs(obj, path: Path) -> None:
    """``torch.save`` of ``obj`` to ``path`` with its records' CRC-32s (what a load checks; a
    caller may have turned them off for faster saves of its own), flushed to disk."""
    crcs = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)
    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    finally:
        torch.serialization.set_crc32_options(crcs)


def is_sharded(path) -> bool:
    """Whether ``path`` names a sharded state (a folder, or the link to one), not a file."""
    return Path(path).is_dir()


def _linked(path: Path) -> str:
    """The folder name ``path`` links to; ValueError for a link a save did not make."""
    now = os.readlink(path)
    if now not in (f"{path.name}.{b}" for b in _BUFFERS):
        raise ValueError(f"{path} links to {now!r}, not to {path.name}.a or {path.name}.b: "
                         "not a link a sharded save made")
    return now


def resolve(path: Path) -> Path:
    """The folder of the state ``path`` names: the link's target, or ``path`` itself."""
    return path.with_name(_linked(path)) if path.is_symlink() else path


def fallback(path: Path) -> Path:
    """The other folder of the link ``path``: the save before the last, or the one the next
    save writes."""
    now = _linked(path)
    return path.with_name(f"{path.name}.{_BUFFERS[now.endswith('.a')]}")


def target_folder(path: Path) -> Path:
    """The folder the next save writes: the one of the two that ``path`` does not link to.
    Refuses a ``path`` that is something else than such a link (a file, a folder of its own),
    a link whose folder is gone (the other may then hold the only state left), and a folder
    that a ``save(..., wait=False)`` of this process is still writing."""
    if not path.is_symlink():
        if path.exists():
            kind = "folder" if path.is_dir() else "file"
            raise ValueError(f"{path} is a {kind}, not the link a sharded save keeps: save "
                             "sharded states to a path of their own" + (
                                 f" (a state copied with its link followed: `mv {path} "
                                 f"{path}.a && ln -s {path.name}.a {path}` makes it one)"
                                 if (path / INFO).exists() else ""))
        folder = path.with_name(f"{path.name}.{_BUFFERS[0]}")
    elif not resolve(path).is_dir():
        raise ValueError(f"{path} links to {os.readlink(path)}, which is gone; nothing was "
                         f"saved ({fallback(path)} may hold the only state left: move it "
                         "away, or remove the link, to save here)")
    else:
        folder = fallback(path)
    if str(folder.resolve()) in _WRITING:
        raise ValueError(f"{folder} is still being written by a save(..., wait=False) of "
                         "another Trainer; nothing was saved (its finish_save() first)")
    return folder


def prepare(folder: Path) -> None:
    """An empty ``folder`` (what a killed save left there is removed)."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(path: Path, folder: Path, info: dict) -> None:
    """Rank 0, once every rank's files are written: ``info.pt`` into ``folder``, the folder's
    entries to disk, then the link ``path`` replaced by one to ``folder`` (``os.replace``: a
    reader sees the old link or the new, never none) and that to disk too."""
    save_with_crcs(info, folder / INFO)
    _fsync_folder(folder)
    link = path.with_name(f"{path.name}.link")
    link.unlink(missing_ok=True)
    os.symlink(folder.name, link)
    os.replace(link, path)
    _fsync_folder(path.parent)


def read_info(folder) -> dict:
    """``info.pt`` of the sharded state in ``folder``, its CRC-32s checked; ValueError for a
    folder that is not one (or a save that did not finish: ``info.pt`` is written last),
    ``Changed`` for one whose ``info.pt`` changed."""
    folder = Path(folder)
    info_file = folder / INFO
    if not info_file.exists() or not (folder / ".metadata").exists():
        have = sorted(p.name for p in folder.iterdir())[:6] if folder.is_dir() else []
        raise ValueError(f"{folder} is not a state Trainer.save(..., sharded=True) finished "
                         f"(no {INFO} or .metadata; it holds {have})")
    check_zip_crcs(info_file)
    try:
        info = torch.load(info_file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (a cut or foreign file: say which)
        raise ValueError(f"{info_file} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(info, dict) or info.get("format") != 1:
        raise ValueError(f"{info_file} is not the info of a sharded state (format 1)")
    return info


def saved_weights(folder) -> dict[str, torch.Tensor]:
    """The weights the state in ``folder`` holds, as tensors of their shape and dtype that use
    one element of memory each (zero strides): what the Trainer's checks of weights read."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    out = {}
    for key, m in md.items():
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata):
            size = tuple(m.size)
            out[key[len("model."):]] = torch.empty_strided(size, (0,) * len(size),
                                                           dtype=m.properties.dtype)
    return out


def _file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def crc_problems(folder, crcs: dict[str, int], rank: int, world: int) -> list[str]:
    """This rank's share of the files (every ``world``-th, from ``rank``) whose CRC-32 is not
    the one saved, or that are missing."""
    folder = Path(folder)
    bad = []
    for name in sorted(crcs)[rank::world]:
        f = folder / name
        if not f.exists():
            bad.append(f"{name} is missing")
        elif _file_crc(f) != crcs[name]:
            bad.append(f"{name} fails its CRC-32 check")
    return bad


def gather_crcs(folder: Path, device=None) -> dict[str, int] | None:
    """Every rank's CRC-32 of the files DCP wrote for it (``__<rank>_<i>.distcp``), and of
    ``.metadata``, on rank 0 (None on the others). A collective: a rank that cannot read its
    files raises there, and the others raise an OSError naming it (one gather either way)."""
    mine, error = None, None
    try:
        mine = {p.name: _file_crc(p) for p in sorted(folder.glob(f"__{comm.rank()}_*.distcp"))}
        if comm.rank() == 0:
            mine[".metadata"] = _file_crc(folder / ".metadata")
    except OSError as e:
        error = e
    every = comm.gather_objects((mine, None if error is None else str(error)), device=device)
    if error is not None:
        raise error
    failed = [(r, text) for r, (_, text) in enumerate(every) if text is not None]
    if failed:
        raise OSError(f"rank {failed[0][0]} could not read the files it saved: {failed[0][1]}")
    if comm.rank() != 0:
        return None
    # a rank that wrote where rank 0 does not see (another filesystem at that path): its files
    # are missing here, and a load would have refused the published state as changed
    away = [(r, sorted(d)) for r, (d, _) in enumerate(every)
            if any(not (folder / name).exists() for name in d)]
    if away:
        r, names = away[0]
        raise OSError(f"rank {r}'s files ({', '.join(names)}) are not in {folder} as rank 0 "
                      f"sees it ({len(away)} rank(s) so): every rank must see the save's path "
                      "(one shared filesystem); nothing was published")
    return {name: crc for d, _ in every for name, crc in d.items()}
