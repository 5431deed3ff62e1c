"""Train the engine's Llama-style model with its sequence split over ranks, resumably.

    .venv/bin/python scripts/train.py --out runs/tiny                # 4 local gloo ranks
    .venv/bin/python scripts/train.py --out runs/tiny --steps 200    # again: resumes
    .venv/bin/python scripts/train.py --out runs/docs --window 256 --doc-len 512 --kv-heads 1
    .venv/bin/python scripts/train.py --out runs/own --model-config path/to/config.json
    torchrun --nproc-per-node 8 scripts/train.py --out runs/7b --model 7b --device cuda \\
        --dtype bfloat16 --seq-len 262144 --checkpointing selective

Each step's batch comes from ``burst.engine.data`` (synthetic runs of equal tokens, so the loss
goes down) with the step number as its seed, so a resumed run sees the batches the uninterrupted
one would have. Every ``--save-every`` steps and at the end the whole training state goes to
``<out>/state.pt`` (``Trainer.save``: weights and optimizer, gathered on rank 0 and written
atomically; with ``--sharded-state``, every rank's own shards in ``<out>/state``, a link to the
last of two folders: ``burst.engine.sharded_state``; across nodes ``--out`` must then be on a
filesystem every rank sees; ``--async-save`` writes them in the background while the next
steps run, published at the next save, the last one waited for), and each
step's loss, time (the slowest rank's), tokens/s per rank, the layout (world, CP and DP sizes)
and the bytes rank 0's attention layers sent (a recomputed forward included; ``_inter_node``:
those that left its node, i.e. the double ring's node of ``--ranks-per-node`` ranks (or the
method's own), else torchrun's host; local ranks without a double ring are one node) to
``<out>/steps.jsonl``. Started again with the same ``--out``, a run resumes from its last save,
with the losses it would have had (the steps logged after that save are run again and their
lines replaced), also on another number of ranks (``--world``), CP degree, ``--batch`` or
``--data-parallel`` wrapper, as long as the global batch (``--batch`` sequences per DP group x
the DP size) stays (a bfloat16 run keeps fp32 master weights only where FSDP shards over more
than one rank: resumed where it does not, they are rounded, and a run without them resumed
where it does gains them, each with a warning, and its losses drift); the other arguments but
``--steps``, ``--save-every``, ``--async-save`` and ``--time-limit-min`` must be those it
started with
(``<out>/run.json``; a default named, such as the model's own ``--kv-heads``, is the same
argument). Arguments the engine would refuse (a method, layout, length or ``--ranks-per-node``
that cannot run on the ranks) are refused before any rank starts. Rank 0 alone reads and
writes ``--out`` (with ``--sharded-state`` every rank writes and reads its shards there). A run
holds ``<out>/.lock`` while it writes there (its launcher, or rank 0 under torchrun): the same
command started again meanwhile is refused, and the ranks of a launcher that was killed die
with it (``burst.spawn``). A log line that is not a step's record is refused before a resume,
and so is a cut or unfinished state; steps the log lacks are named.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _args import nonnegative_float, positive_float, positive_int  # noqa: E402  (scripts/)

from burst import comm  # noqa: E402
from burst.engine import (  # noqa: E402
    CHECKPOINTING,
    CONFIGS,
    Trainer,
    config_from_file,
    param_count,
    sharded_state,
)
from burst.engine.attention_call import resolve_attention  # noqa: E402
from burst.engine.checkpointing import check_mode  # noqa: E402
from burst.engine.configs import config_from_fields  # noqa: E402
from burst.engine.parallel import DATA_PARALLEL, cp_degree_ok  # noqa: E402
from burst.engine.trainer import DTYPES, OPTIMIZERS, seq_len_problems  # noqa: E402
from burst.layout import chunks_per_rank  # noqa: E402
from burst.masks import MaskSpec, interleaved_windows, layer_windows, model_window  # noqa: E402
from burst.spawn import SpawnError, interrupt_on_termination, spawn  # noqa: E402
from results.store import RunLock, RunLockedError, replace_text  # noqa: E402

PASSES = ("forward", "backward")  # the attention's phases in burst.comm's byte counter
# what may change when a run is resumed; everything else is the run's identity
RESUMABLE = ("out", "steps", "save_every", "async_save", "time_limit_min", "world")
# the layout over the ranks: a resume may change it (Trainer.load restores on any CP x DP layout
# and DP wrapper) as long as the global batch, which the identity keeps, stays
LAYOUT = ("cp_degree", "batch", "data_parallel")


class _Defaults(argparse.HelpFormatter):
    """--help shows each option's default, where its help does not already say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and "default" not in text
                and not any(action.default is v for v in (None, False, argparse.SUPPRESS))):
            text += " (default: %(default)s)"
        return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=_Defaults)
    p.add_argument("--out", required=True,
                   help="folder of state.pt (or state), steps.jsonl, run.json")
    p.add_argument("--model", default=None, choices=sorted(CONFIGS),
                   help="engine config (default: tiny, unless --model-config gives the model)")
    p.add_argument("--model-config", type=_model_config_file, default=None, metavar="FILE",
                   help="a model of your own: the Hugging Face config.json of a Llama-style "
                        "model (llama, mistral, ministral; burst.engine.config_from_file), "
                        "instead of --model; its fields are the run's identity, not the "
                        "path; every torchrun process reads it (a path every node sees)")
    p.add_argument("--world", type=positive_int, default=4,
                   help="local gloo ranks (ignored under torchrun, which sets the world)")
    p.add_argument("--cp-degree", type=positive_int, default=None,
                   help="ranks per context-parallel group (default: all; the rest is DP)")
    p.add_argument("--data-parallel", default="ddp", choices=DATA_PARALLEL,
                   help="DP wrapper; fsdp_world shards the states over every rank (ZeRO-3)")
    p.add_argument("--method", default="burst", help="attention method (baselines.registry)")
    p.add_argument("--layout", default=None, choices=("contiguous", "zigzag", "striped"),
                   help="how the sequence is split over the ranks (default: the method's own, "
                        "e.g. zigzag for burst, contiguous for ring)")
    p.add_argument("--ranks-per-node", type=positive_int, default=None,
                   help="the topology-aware double ring: an intra-node ring of this many ranks "
                        "(default: a flat ring)")
    p.add_argument("--backward", default=None, choices=("burst", "ring", "auto"),
                   help="BurstAttention's backward (default: the method's)")
    p.add_argument("--checkpointing", default="selective", choices=CHECKPOINTING,
                   help="recomputation mode")
    p.add_argument("--plain-head", action="store_true", help="unfused LM head + loss")
    p.add_argument("--kv-heads", type=positive_int, default=None,
                   help="K/V heads (GQA; default: the model config's)")
    p.add_argument("--window", type=int, default=None,
                   help="sliding window: each token sees itself and the WINDOW tokens before it")
    p.add_argument("--global-every", type=positive_int, default=None,
                   help="with --window: every GLOBAL_EVERY-th layer attends its whole causal "
                        "context, the others the window (local and global layers "
                        "interleaved: 6 for Gemma 3, 2 for Gemma 2)")
    p.add_argument("--doc-len", type=positive_int, default=None,
                   help="documents of DOC_LEN tokens (the last may be shorter), each attending "
                        "only within itself, positions restarting at each")
    p.add_argument("--seq-len", type=positive_int, default=1024, help="tokens per sequence")
    p.add_argument("--batch", type=positive_int, default=1,
                   help="sequences per data-parallel group")
    p.add_argument("--steps", type=positive_int, default=20, help="total steps of the run")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="learning rate")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS, help="optimizer")
    p.add_argument("--weight-decay", type=nonnegative_float, default=0.0, help="weight decay")
    p.add_argument("--seed", type=int, default=0, help="initial weights")
    p.add_argument("--dtype", default="float32", choices=[str(d).split(".")[1] for d in DTYPES],
                   help="weights and compute")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where ranks run")
    p.add_argument("--save-every", type=positive_int, default=10,
                   help="steps between saves of the state")
    p.add_argument("--sharded-state", action="store_true",
                   help="save the state as every rank's shards (<out>/state: "
                        "torch.distributed.checkpoint) instead of one file gathered on rank 0 "
                        "(<out>/state.pt); the run's identity: a resume keeps it")
    p.add_argument("--async-save", action="store_true",
                   help="with --sharded-state: write each save in the background while the next "
                        "steps run (Trainer.save(wait=False): a host copy of each rank's state; "
                        "a save is published by the next one, the last one is waited for, and "
                        "a run killed meanwhile resumes from the save before)")
    p.add_argument("--time-limit-min", type=positive_float, default=24 * 60,
                   help="local ranks: the whole run's limit (a hung rank is killed at it)")
    return p


def _model_config_file(path: str) -> dict:
    """--model-config: the fields of the ModelConfig the config.json at ``path`` defines, in
    JSON's own forms (run.json keeps them, and a resume compares them: editing the file makes
    another run); a file the engine cannot build is a usage error."""
    try:
        return _json_fields(config_from_file(path))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _json_fields(cfg) -> dict:
    """Every field of a ModelConfig as run.json holds them (JSON's lists for tuples)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _base_model(args: dict):
    """(name run.json records, config) of the model the arguments give before --kv-heads: a
    built-in config (--model, tiny by default), or --model-config's fields (name None).
    ValueError for both, for an unknown name, or for fields that are no model."""
    own = args.get("model_config")
    if own is None:
        name = args["model"] or "tiny"
        if name not in CONFIGS:
            raise ValueError(f"unknown model {name!r}; valid: {', '.join(sorted(CONFIGS))}")
        return name, CONFIGS[name]
    if args["model"] is not None:
        raise ValueError(f"--model {args['model']} and --model-config give two models; give "
                         "one")
    return None, config_from_fields(own)


def _model_name(args: dict) -> str:
    """The model as the run's lines name it."""
    return args["model"] or ("tiny" if args.get("model_config") is None
                             else "the --model-config model")


def _identity(args: dict, world: int) -> dict:
    """What a resumed run must keep: its arguments but RESUMABLE, with the defaults they leave
    to the model and the method written out (``--kv-heads 2`` names the tiny model's own
    K/V heads, ``--backward burst`` and ``--layout zigzag`` the burst method's own backward and
    layout: the same run), and its
    global batch (``--batch`` sequences per DP group x the DP size, whatever the world); a
    window or documents spanning the whole sequence are no mask. ValueError for an unknown
    model or method."""
    name, cfg = _base_model(args)
    method, options, layout = _attention(args)
    effective = {**method.options, **options}
    dp = world // (args["cp_degree"] or world)
    return {**{k: v for k, v in _whole_sequence_masks(args).items()
               if k not in RESUMABLE + LAYOUT},
            "model": name, "model_config": None if name else _json_fields(cfg),
            "kv_heads": cfg.num_kv_heads if args["kv_heads"] is None else args["kv_heads"],
            **{k: effective.get(k) for k in ("ranks_per_node", "backward")},
            "layout": layout,
            "global_batch": args["batch"] * dp}


def _other_model(got: list) -> str | None:
    """Under torchrun each process reads --model-config itself: given every rank's (problem,
    model fields), why they cannot train one model together (None: they can)."""
    return next((f"rank {r} read another model from --model-config than rank 0 (the file "
                 "differs between nodes): give every node the same file"
                 for r, (_, fields) in enumerate(got) if fields != got[0][1]), None)


def _differences(differ: dict) -> list[str]:
    """``key: <then> then, <now> now`` for each argument that differs; a model's fields one by
    one (``model_config.rope_theta: ...``), and no name as --model-config's model (a built-in
    model for an own one is said once, by ``model``)."""
    out = []
    for k, (a, b) in sorted(differ.items()):
        if k == "model_config":
            if isinstance(a, dict) and isinstance(b, dict):
                out += [f"model_config.{f}: {a.get(f)!r} then, {b.get(f)!r} now"
                        for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)]
        elif k == "model":
            a, b = (repr(x) if x is not None else "--model-config's" for x in (a, b))
            out.append(f"model: {a} then, {b} now")
        else:
            out.append(f"{k}: {a!r} then, {b!r} now")
    return out


def _count(n: int, word: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {word}{'s' * (n != 1)}"


def _whole_sequence_masks(args: dict) -> dict:
    """``args`` with a --window or --doc-len that spans the whole sequence dropped: causal
    attention over one document is no mask at all, the same run (and no mask's faster path)."""
    n = args["seq_len"]
    out = {**args, **{k: None for k, last in (("window", n - 1), ("doc_len", n))
                      if args[k] is not None and args[k] >= last}}
    if out["window"] is None and args["window"] is not None:  # no layer has a window
        out["global_every"] = None
    return out


def _model(args: dict):
    """(model config, window, cu_seqlens) the arguments ask for; ValueError if they cannot be."""
    args = _whole_sequence_masks(args)
    cfg = _base_model(args)[1]
    if args["kv_heads"] is not None:
        cfg = dataclasses.replace(cfg, num_kv_heads=args["kv_heads"])
    window = None if args["window"] is None else (args["window"], 0)
    if window is not None:
        try:
            MaskSpec(causal=True, window=window)  # the engine's own check of a window
        except ValueError as e:
            raise ValueError(f"--window {args['window']}: {e}") from None
    if args.get("global_every") is not None:
        if window is None:
            raise ValueError(f"--global-every {args['global_every']} needs --window (the "
                             "local layers' window)")
        every, layers = args["global_every"], cfg.num_layers
        if every == 1 or every > layers:  # every layer global (--window dropped without a
            # word) or every one local: a typo, not a pattern, as a sweep spec says (suites.spec)
            raise ValueError(
                f"--global-every {every}: every layer would be "
                + (f"global, so --window {args['window']} would apply to none; drop --window"
                   if every == 1 else f"local ({_model_name(args)} has {layers} layers); drop "
                   "--global-every") + f", or give {'2' if layers == 2 else f'2 to {layers}'}")
        window = model_window(interleaved_windows(window, layers, every), layers)
    cu = None
    if args["doc_len"] is not None:
        if args["doc_len"] < 2:
            raise ValueError(f"--doc-len {args['doc_len']}: a document of one token has no "
                             "next token to learn from; use 2 or more")
        cu = [*range(0, args["seq_len"], args["doc_len"]), args["seq_len"]]
    return cfg, window, cu


def _attention(args: dict):
    """(registry method, the options train.py gives it, the layout they resolve to: the
    method's own unless --layout names one); ValueError for an unknown method or one that is
    not an attention core (a block-level one, such as tp, needs the block's weights)."""
    from baselines import registry

    method = registry.get(args["method"])
    if getattr(method, "level", "core") != "core":
        raise ValueError(f"method {args['method']!r} is {method.level}-level (it needs the "
                         "attention block's projection weights, not q, k, v), so it cannot be "
                         "the model's attention; use a core method: "
                         + ", ".join(registry.names(available_only=True, level="core")))
    options = {k: args[k] for k in ("layout", "ranks_per_node", "backward")
               if args[k] is not None}
    return method, options, resolve_attention(method, options)[1]


def _preflight(args: dict, world: int) -> None:
    """ValueError naming every reason the arguments cannot train on ``world`` ranks, asked on
    one process before any rank starts: the checks each rank's Trainer makes of its setup and
    first batch (the method's own, the layout's split, the checkpointing mode, the documents)."""
    cfg, _, cu = _model(args)
    method, options, layout = _attention(args)
    cp, seq = args["cp_degree"] or world, args["seq_len"]
    problems = seq_len_problems(cfg, seq, cp_size=cp, layout=layout,
                                checkpointing=args["checkpointing"])
    # a length that does not split over the ranks is reported once (with the length to pad
    # to); the method is asked about the rest at that padded length
    parts = cp * chunks_per_rank(layout)
    seq_local = (seq + (-seq) % parts) // cp
    checks = [lambda: check_mode(args["checkpointing"], layout, method),
              lambda: method.check(world=cp, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                                   seq_local=seq_local, causal=True, **options)]
    if cu is not None:
        checks.append(lambda: MaskSpec(causal=True, cu_seqlens=cu).check_length(seq))
    for check in checks:
        try:
            check()
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ValueError("; ".join(problems))


def _check_run(args: dict, world: int) -> str | None:
    """Why the run in ``--out`` cannot go on with these arguments on ``world`` ranks (None: it
    can); records the arguments of a new run. Called on one process (rank 0). The recorded
    arguments bind only once a state was saved: a start that failed before its first save (an
    unknown method, a length the layout cannot split) is replaced by the next one."""
    if not cp_degree_ok(args["cp_degree"] or world, world):
        return (f"--cp-degree {args['cp_degree']} does not divide the world of "
                f"{_count(world, 'rank')} (nothing was written)")
    try:
        _preflight(args, world)
        mine = _identity(args, world)
    except ValueError as e:
        return f"{e} (nothing was written)"
    out = Path(args["out"])
    run = out / "run.json"  # (an --out that is a file: refused by _Writer.take, before this)
    state = _state_path(out, args)
    # either kind of state binds the folder to its run (a resume must keep --sharded-state)
    has_state = any(out.joinpath(n).exists() or out.joinpath(n).is_symlink()
                    for n in ("state.pt", "state"))
    if run.exists() and not has_state:  # another tool's run.json (a sweep run's) is not
        try:  # replaced: that folder is not this script's
            other = json.loads(run.read_text())
        except (OSError, ValueError):
            other = None
        if isinstance(other, dict) and "sweep" in other:
            return (f"{run} is a burst-bench sweep run's (sweep {other['sweep']!r}), not a "
                    "training run's: its rows would lose their spec; use another --out "
                    "(nothing was written)")
    if has_state and not run.exists():
        return (f"{out} holds a saved state but no run.json (the arguments it was started "
                "with); use another --out")
    if run.exists() and has_state:
        try:
            saved = json.loads(run.read_text())
            if not isinstance(saved, dict):
                raise ValueError(f"it holds a {type(saved).__name__}, not the run's arguments")
        except (OSError, ValueError) as e:
            return f"{run} cannot be read ({e}); use another --out"
        # an argument added since that run was started: it ran with the default
        defaults = vars(_parser().parse_args(["--out", str(out)]))
        saved = {**{k: v for k, v in defaults.items() if k in mine}, **saved}
        try:  # one written before the defaults were written out: write them out now
            saved = {**saved, **{k: v for k, v in _identity({**defaults, **saved}, world).items()
                                 if k in ("kv_heads", "ranks_per_node", "backward", "layout",
                                          "window", "global_every", "doc_len",
                                          "model_config")}}
        except (ValueError, TypeError, KeyError) as e:  # an edited file: a value of a wrong type
            return (f"{run} names a run this version cannot rebuild ({type(e).__name__}: {e}); "
                    "use another --out")
        differ = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
        if not differ:  # the same run: it resumes if its files can be read
            return _state_problem(state) or _log_problem(out / "steps.jsonl")
        return (f"{out} holds a run started with other arguments ("
                + ", ".join(_differences(differ))
                + "); use another --out, or the same arguments (--world, --cp-degree, "
                "--batch and --data-parallel may change where the global batch stays)")
    out.mkdir(parents=True, exist_ok=True)
    replace_text(run, json.dumps(mine, indent=1, sort_keys=True) + "\n")
    return None


class _Writer:
    """This run's hold on ``--out`` (``results.store.RunLock``, released when the process that
    holds it ends, however it ends): a second start of the same folder while a run trains in
    it is refused, where the two wrote over each other's saves and logs. Taken by the process
    that writes run.json (the launcher, or rank 0 under torchrun) before it checks the folder."""

    def __init__(self, out: Path):
        self.out, self.lock, self.made = out, None, []

    def take(self) -> str | None:
        """Why this run cannot write ``out`` (None: it holds it now)."""
        out = self.out
        if out.exists() and not out.is_dir():
            return f"--out {out} is a file, not a folder (nothing was written)"
        # the folders the lock makes, innermost first (a run refused removes them again)
        self.made = [p for p in (out, *out.absolute().parents) if not p.exists()]
        lock = RunLock(out)
        try:
            lock.__enter__()
        except RunLockedError:
            return (f"{out} is being written by another training run (it holds {out}/.lock); "
                    "wait for it to end, or use another --out")
        self.lock = lock
        return None

    def release(self) -> None:
        if self.lock is None:
            return
        try:  # a run refused before it wrote anything leaves no folder: removed while held
            # (a run that opened the lock file meanwhile finds it gone: results.store.RunLock)
            lock = self.out / ".lock"
            left = []
            with contextlib.suppress(FileNotFoundError):  # --out removed while it ran
                left = [p.name for p in self.out.iterdir()]
            if self.made and left == [lock.name]:
                lock.unlink()
                for folder in self.made:
                    try:
                        folder.rmdir()
                    except OSError:  # not empty (another run wrote there): kept
                        break
        finally:
            self.lock.__exit__(None, None, None)
            self.lock = None


def _log_lines(log: Path, below: int) -> list[str]:
    """The log's lines of the steps before ``below`` (the ones a resume keeps)."""
    if not log.exists() or below <= 0:  # a start: the lines of a run killed before a save go
        return []
    return [line for line in log.read_text().splitlines(keepends=True)
            if line.endswith("\n") and json.loads(line)["step"] < below]


def _state_path(out: Path, args: dict) -> Path:
    return out / ("state" if args.get("sharded_state") else "state.pt")


def _state_problem(state: Path) -> str | None:
    """Why ``state`` is not a whole saved state (None: it looks whole): torch.save writes a zip
    whose directory is at its end, so a cut file is found by reading that directory alone,
    before any rank starts (Trainer.save writes atomically: only a damaged disk or copy cuts).
    A sharded state: its info file, which its save writes last, reads (the CRC-32 of every
    file is checked by the load)."""
    if sharded_state.is_sharded(state):
        try:
            sharded_state.read_info(state)
        except (ValueError, OSError) as e:
            return f"{e}; restore it, or remove it and steps.jsonl to start again"
        try:  # where the next save would go: a folder copied with its link followed (cp -rL,
            # scp -r) would load, and fail at its first save
            sharded_state.target_folder(state)
        except ValueError as e:
            return str(e)
        return None
    try:
        with zipfile.ZipFile(state) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:  # (a damaged index: a name that
        # is no UTF-8, a UnicodeDecodeError)
        return (f"{state} is not a whole saved state ({type(e).__name__}: {e}); restore it, or "
                "remove it and steps.jsonl to start again")
    return None


def _log_problem(log: Path) -> str | None:
    """Why the log cannot be kept by a resume (None: it can): a whole line that is not a
    step's JSON (a torn last line is a killed writer's, dropped by the resume)."""
    if not log.exists():
        return None
    try:
        lines = log.read_text().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError) as e:
        return f"{log} cannot be read ({e}); remove it (losing the earlier steps' log) to resume"
    for i, line in enumerate(lines, 1):
        if not line.endswith("\n"):
            continue
        try:
            step = json.loads(line)["step"]
            if type(step) is not int:  # a bool, float or text: not what the resume compares
                raise TypeError(f"step {step!r} is not a whole number")
        except (ValueError, TypeError, KeyError) as e:
            return (f"{log} line {i} is not a step's record ({type(e).__name__}: {e}); "
                    "remove that line (or the file, losing the earlier steps' log) to resume")
    return None


def _train(rank: int, world: int, args: dict, host_ranks: int | None = None) -> None:
    device = torch.device(args["device"])
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    cfg, window, cu = _model(args)
    method, options, layout = _attention(args)
    # nodes for the byte log: the double ring's (its --ranks-per-node, or the method's own
    # default, e.g. double_ring's 2), else the host's ranks (all local ranks are one host)
    rpn = {**method.options, **options}.get("ranks_per_node") or host_ranks or world
    tr = Trainer(cfg, attention=method, attention_options=options,
                 cp_degree=args["cp_degree"] or world, data_parallel=args["data_parallel"],
                 checkpointing=args["checkpointing"], fused_head=not args["plain_head"],
                 dtype=getattr(torch, args["dtype"]), device=device, lr=args["lr"],
                 optimizer=args["optimizer"], weight_decay=args["weight_decay"],
                 seed=args["seed"], window=window)
    out = Path(args["out"])
    state, log = _state_path(out, args), out / "steps.jsonl"
    start = 0
    if comm.gather_objects(state.exists() if rank == 0 else None, device=device)[0]:
        start = tr.load(state)["step"]
    say = print if rank == 0 else (lambda *a, **k: None)
    if start >= args["steps"]:  # the log and the state stay as they are
        say(f"{out} is already at step {start} >= --steps {args['steps']}: nothing to do "
            "(a larger --steps trains on)", flush=True)
        return
    local = [w for w in layer_windows(window, cfg.num_layers) if w is not None]
    mask = "".join([f", window {local[0][0]}" if local else "",
                    f" on {len(local)} of {cfg.num_layers} layers"
                    if 0 < len(local) < cfg.num_layers else "",
                    f", {_count(len(cu) - 1, 'document')}" if cu else ""])
    ring = "".join([f", {_count(rpn, 'rank')} per node" if rpn < world else "",
                    f", backward {args['backward']}" if args["backward"] else ""])
    say(f"{_model_name(args)} ({param_count(cfg):,} parameters, {_count(cfg.num_heads, 'head')}, "
        f"{_count(cfg.num_kv_heads, 'K/V head')}), {_count(world, 'rank')} (CP {tr.cp_size} x "
        f"DP {tr.dp_size}), "
        f"{args['method']} {layout}{ring}{mask}, checkpointing {args['checkpointing']}, "
        f"{args['seq_len']} tokens x {args['batch']} per DP group; "
        + (f"resuming at step {start}" if start else "from the start"), flush=True)
    if rank == 0:  # drop what ran after the last save: it runs again
        kept = _log_lines(log, start)
        replace_text(log, "".join(kept))
        missing = sorted(set(range(start)) - {json.loads(line)["step"] for line in kept})
        if missing:
            print(f"warning: {log} has no line for {_count(len(missing), 'step')} of the "
                  f"{start} the saved state has done (first: step {missing[0]}); the log of "
                  "this run lacks them", file=sys.stderr, flush=True)
    tokens = args["seq_len"] * args["batch"] * tr.dp_size
    for step in range(start, args["steps"]):
        batch = tr.local_batch(args["seq_len"], batch=args["batch"], seed=step, cu_seqlens=cu)
        comm.barrier()
        t0 = time.perf_counter()
        with comm.count_bytes(rpn) as sent:
            loss = tr.step(*batch, cu_seqlens=cu)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # the step took as long as its slowest rank
        dt = comm.all_reduce(torch.tensor([time.perf_counter() - t0], dtype=torch.float64,
                                          device=device), op="max").item()
        if rank == 0:
            # what rank 0's attention layers sent (burst.comm's forward and backward phases,
            # with a recomputed forward; not the checks, the loss or DDP/FSDP), and how much
            # of it left its node of rpn ranks
            # tokens/s per rank (GPU), as the harness' rows count it; world, CP and DP tell the
            # lines of a run resumed on another layout apart
            row = {"step": step, "loss": loss, "seconds": dt,
                   "tokens_per_s": tokens / dt / world, "world": world, "cp": tr.cp_size,
                   "dp": tr.dp_size,
                   **{f"attention_sent{k}_bytes": sum(sent.sent(p, link) for p in PASSES)
                      for k, link in (("", None), ("_inter_node", "inter"))},
                   **{f"attention_sent_{p}_bytes": sent.sent(p) for p in PASSES}}
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")
            say(f"step {step + 1:>5}/{args['steps']}  loss {loss:.4f}  {dt:7.2f} s  "
                f"{tokens / dt / world:9.0f} tokens/s/rank  attention sent "
                f"{row['attention_sent_bytes'] / 2**20:.3f} MiB (forward "
                f"{row['attention_sent_forward_bytes'] / 2**20:.3f}, backward "
                f"{row['attention_sent_backward_bytes'] / 2**20:.3f})", flush=True)
        if (step + 1) % args["save_every"] == 0 or step + 1 == args["steps"]:
            if rank == 0:  # on disk before the state that has done its steps
                with open(log, "a") as f:
                    os.fsync(f.fileno())
            tr.save(state, meta={"step": step + 1}, sharded=args["sharded_state"],
                    wait=not args["async_save"] or step + 1 == args["steps"])
    say(f"done: {_count(args['steps'], 'step')}; state in {state}, losses in {log}",
        flush=True)


def main(argv=None) -> None:
    torchrun = "RANK" in os.environ  # each rank is its own process, torchrun's to signal
    rank = os.environ.get("RANK", "0")

    def say(text: str) -> None:
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print(text, file=sys.stderr, flush=True)

    try:  # the launcher: SIGTERM, SIGHUP as Ctrl-C (torchrun stops its ranks itself)
        with contextlib.nullcontext() if torchrun else interrupt_on_termination():
            _main(argv)
    except KeyboardInterrupt as e:  # Ctrl-C: the ranks were stopped (spawn kills them first)
        if rank == "0":  # one line, not one per torchrun process
            say(f"interrupted{f' ({e})' if str(e) else ''}; run the same command again to "
                "resume from the last saved step")
        raise SystemExit(130) from None
    except OSError as e:  # this process's own files (--out, run.json, its lock): one line
        who = f"train.py (rank {rank})" if torchrun else "train.py"
        say(f"{who}: {e}; a state saved before is kept: fix that and run the same command "
            "again to resume")
        raise SystemExit(1) from None
    except SpawnError as e:  # each failed rank's traceback, not the launcher's own
        say(f"train.py: {e}\n(a state saved before stays in --out as it was)")
        raise SystemExit(1) from None


def _main(argv=None) -> None:
    ap = _parser()
    args = vars(ap.parse_args(argv))
    if args["device"] == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here (--device cpu runs on gloo "
                 "ranks)")
    if args["async_save"] and not args["sharded_state"]:
        ap.error("--async-save needs --sharded-state (the one-file state is gathered and "
                 "written by rank 0 alone)")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun, SLURM via torchrun
        device = None
        if args["device"] == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        # a save on rank 0 keeps the others waiting: the time limit, not a 10-minute default
        comm.init("nccl" if device is not None else "gloo", device_id=device,
                  timeout_s=args["time_limit_min"] * 60)
        writer = _Writer(Path(args["out"]))
        try:
            problem = None
            if comm.rank() == 0:
                problem = writer.take() or _check_run(args, comm.world_size())
            got = comm.gather_objects((problem, args["model_config"]), device=device)
            problem = got[0][0] or _other_model(got)
            if problem:
                raise SystemExit(problem)
            _train(comm.rank(), comm.world_size(), args,
                   host_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None)
        finally:
            writer.release()
            comm.destroy()
        return
    writer = _Writer(Path(args["out"]))
    try:
        problem = writer.take() or _check_run(args, args["world"])
        if problem:
            raise SystemExit(problem)
        spawn(_train, args["world"], args=(args,), backend="nccl" if args["device"] == "cuda"
              else "gloo", timeout_s=args["time_limit_min"] * 60)
    finally:
        writer.release()


if __name__ == "__main__":
    main()
