"""Sharded training states: every rank writes and reads its own shards, nothing is gathered.

``Trainer.save(path, sharded=True)`` keeps the training state as torch.distributed.checkpoint
(DCP) folders: each rank writes the shards it holds (FSDP's slices; a replicated weight once,
by the rank DCP's planner picks), so no rank ever holds the whole state, and a load on any
CP x DP layout and either DP wrapper reads back the slices its ranks need (DCP reshards). Every
rank must see the same folder (a shared filesystem across nodes).

On disk, two folders and a link::

    <path>            -> <name>.a   (a symbolic link: the last complete save)
    <name>.a/         .metadata, __<rank>_<i>.distcp (DCP's), info.pt (ours)
    <name>.b/         the save before it: a whole fallback copy, overwritten by the next save

A save writes over the folder the link does not name, then replaces the link (``os.replace``):
a run killed while saving keeps the last good state whole (the one before it is lost: its
folder was being written, and a load refuses it, having no ``info.pt``). ``info.pt`` holds the
caller's ``meta``, the optimizer's name, the hyperparameters of an optimizer that had taken no
step yet (its empty state is not saved: torch would fill it with a zero-lr step), and a CRC-32
of every file DCP wrote, which a load checks (each rank a share of the files) before it reads:
DCP itself keeps no checksums, and bit rot would resume, silently, from wrong weights.

Unlike the one-file state (read with ``torch.load(weights_only=True)``), DCP unpickles its
``.metadata`` and the optimizer's hyperparameters: load only sharded states you trust.
"""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path

import torch

from burst import comm

__all__ = ["INFO", "crc_problems", "gather_crcs", "is_sharded", "prepare", "publish", "read_info",
           "saved_weights", "target_folder"]

INFO = "info.pt"  # ours, beside DCP's files
_BUFFERS = ("a", "b")


def is_sharded(path) -> bool:
    """Whether ``path`` names a sharded state (a folder, or the link to one), not a file."""
    return Path(path).is_dir()


def target_folder(path: Path) -> Path:
    """The folder the next save writes: the one of the two that ``path`` does not link to.
    Refuses a ``path`` that is something else than such a link (a file, a folder of its own)."""
    if path.exists() or path.is_symlink():
        if not path.is_symlink():
            kind = "folder" if path.is_dir() else "file"
            raise ValueError(f"{path} is a {kind}, not the link a sharded save keeps: save "
                             "sharded states to a path of their own")
        now = os.readlink(path)
        for b in _BUFFERS:
            if now == f"{path.name}.{b}":
                other = _BUFFERS[1 - _BUFFERS.index(b)]
                return path.with_name(f"{path.name}.{other}")
        raise ValueError(f"{path} links to {now!r}, not to {path.name}.a or {path.name}.b: "
                         "not a link a sharded save made")
    return path.with_name(f"{path.name}.{_BUFFERS[0]}")


def prepare(folder: Path) -> None:
    """An empty ``folder`` (what a killed save left there is removed)."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def own_files(folder: Path, rank: int) -> list[str]:
    """The files DCP's file writer made for ``rank`` (``__<rank>_<i>.distcp``)."""
    return sorted(p.name for p in folder.glob(f"__{rank}_*.distcp"))


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def publish(path: Path, folder: Path, info: dict) -> None:
    """Rank 0, once every rank's files are written: ``info.pt`` into ``folder``, then the link
    ``path`` replaced by one to ``folder`` (atomically)."""
    with open(folder / INFO, "wb") as f:
        torch.save(info, f)
        f.flush()
        os.fsync(f.fileno())
    link = path.with_name(f"{path.name}.link")
    link.unlink(missing_ok=True)
    os.symlink(folder.name, link)
    os.replace(link, path)
    fd = os.open(path.parent, os.O_RDONLY)  # the rename itself on disk
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_info(path) -> dict:
    """``info.pt`` of the sharded state at ``path``; raises ValueError for a folder that is not
    one (or a save that did not finish: ``info.pt`` is written last)."""
    path = Path(path)
    info_file = path / INFO
    if not info_file.exists() or not (path / ".metadata").exists():
        have = sorted(p.name for p in path.iterdir())[:6] if path.is_dir() else []
        raise ValueError(f"{path} is not a state Trainer.save(..., sharded=True) finished "
                         f"(no {INFO} or .metadata; it holds {have})")
    try:
        info = torch.load(info_file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (a cut or foreign file: say which)
        raise ValueError(f"{info_file} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(info, dict) or info.get("format") != 1:
        raise ValueError(f"{info_file} is not the info of a sharded state (format 1)")
    return info


def saved_weights(path) -> dict[str, torch.Tensor]:
    """The weights the state at ``path`` holds, as tensors of their shape and dtype that use
    one element of memory each (zero strides): what the Trainer's checks of weights read."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    out = {}
    for key, m in md.items():
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata):
            size = tuple(m.size)
            out[key[len("model."):]] = torch.empty_strided(size, (0,) * len(size),
                                                           dtype=m.properties.dtype)
    return out


def crc_problems(path, crcs: dict[str, int], rank: int, world: int) -> list[str]:
    """This rank's share of the files (every ``world``-th, from ``rank``) whose CRC-32 is not
    the one saved, or that are missing."""
    path = Path(path)
    names = sorted(crcs)
    bad = []
    for name in names[rank::world]:
        f = path / name
        if not f.exists():
            bad.append(f"{name} is missing")
        elif file_crc(f) != crcs[name]:
            bad.append(f"{name} fails its CRC-32 check")
    return bad


def gather_crcs(folder: Path, device=None) -> dict[str, int] | None:
    """Every rank's CRC-32 of the files it wrote, on rank 0 (None on the others)."""
    mine = {n: file_crc(folder / n) for n in own_files(folder, comm.rank())}
    every = comm.gather_objects(mine, device=device)
    if comm.rank() != 0:
        return None
    out = {".metadata": file_crc(folder / ".metadata")}
    for d in every:
        out.update(d)
    return out
