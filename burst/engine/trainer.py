"""BurstEngine's training step: a Llama-style model on sequences split over a CP group.

    method = baselines.registry.get("burst")        # or "ring", "ulysses", ... (any entry)
    tr = Trainer(get_config("tiny"), attention=method, attention_options={"layout": "striped"},
                 checkpointing="selective_half")
    tokens, targets, positions = tr.local_batch(seq_len=4096)   # this rank's shard only
    loss = tr.step(tokens, targets, positions)                  # global mean loss

One step (issue 4): forward with every layer's attention run by the method over the CP group,
the loss through the fused LM head (or the plain one), backward under the checkpointing mode,
weight gradients summed over the CP group (``burst.comm``), averaged over the DP groups by
torch's DDP/FSDP, then an optimizer step. The loss is the exact mean over every valid target
token of the global batch: each rank scales its token-loss sum by 1 / (global valid count, one
all-reduce), and DP's averaging is undone by scaling the backward by the DP size.

Every rank builds identical weights from ``seed`` (or ``state_dict``) without communication
(under a sharding FSDP, its shard of them alone); one all-gather at construction checks that
every rank's arguments are valid, and that the seed or the weights given, and the setup, are the
same on every rank.
``save(path)`` / ``load(path)`` keep the whole training state (weights and optimizer), so a run
that dies resumes with the losses it would have had, on any CP x DP layout: in one file gathered
on rank 0, or with ``sharded=True`` as every rank's own shards (``burst.engine.sharded_state``).
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import os
import warnings
import zlib
from pathlib import Path

import torch

from burst import comm
from burst.engine import sharded_state
from burst.engine.attention_call import AttentionCall, check_method, resolve_attention
from burst.engine.checkpointing import check_mode
from burst.engine.configs import ModelConfig, get_config, run_window
from burst.engine.data import local_batch, shard_batch
from burst.engine.fused_loss import IGNORE_INDEX, LOSS_CHUNK
from burst.engine.model import CausalLM, assign_whole
from burst.engine.parallel import (
    DATA_PARALLEL,
    SAVE_ERRORS,
    all_reduce_grads,
    cp_degree_ok,
    full_state,
    grid_place,
    grid_problem,
    hyperparameters,
    load_full_state,
    load_local_state,
    make_groups,
    save_local_state,
    stage_local_state,
    wrap_data_parallel,
    write_staged,
)
from burst.layout import divisors, length_problem
from burst.masks import MaskSpec

__all__ = ["DTYPES", "OPTIMIZERS", "Trainer", "dtype_problem", "seq_len_problems"]

# float16 is left out: without loss scaling and fp32 master weights its optimizer step underflows
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
OPTIMIZERS = ("adamw", "sgd")


def _on(have: torch.device, want: torch.device) -> bool:
    """Whether a tensor on ``have`` is on ``want`` (a device without an index, "cuda", is
    the current one: any index passes here)."""
    return have.type == want.type and (want.index is None or have.index == want.index)


def _canonical(x) -> str:
    """One text for values that run alike on every rank: numpy and torch scalars as Python
    numbers, tuples as lists, dicts by key (checksums of ``_agree``/``_check_batch``)."""
    def norm(v):
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            return float(v)
        if isinstance(v, dict):
            return {str(k): norm(w) for k, w in sorted(v.items(), key=lambda kv: str(kv[0]))}
        if isinstance(v, tuple | list):
            return [norm(w) for w in v]
        return repr(v)

    return json.dumps(norm(x))


def _positive_number(x, zero: bool = False) -> bool:
    """A finite number > 0 (``zero``: >= 0): a Python/numpy number or a one-element tensor, not
    a bool."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.dtype == torch.bool:
            return False
        x = x.item()
    return (isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
            and (x >= 0 if zero else x > 0))


def dtype_problem(dtype) -> str | None:
    """Why the engine cannot train in ``dtype`` (a torch dtype or its name; None: it can): the
    one wording for the Trainer, a sweep spec and its cells."""
    shown = _dtype_name(dtype)
    if shown in _BY_NAME:
        return None
    return (f"the engine trains in {', '.join(_BY_NAME)}, not {shown}" + (
        " (float16 would need loss scaling)" if shown in ("float16", "half") else ""))


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


_BY_NAME = {_dtype_name(d): d for d in DTYPES}  # "float32": torch.float32, ...


def seq_len_problems(config: ModelConfig, seq_len: int, *, cp_size: int, layout: str,
                     checkpointing: str) -> list[str]:
    """Why sequences of ``seq_len`` tokens cannot train on a CP group of ``cp_size`` ranks in
    this layout and checkpointing mode (empty: they can). Needs no process group, so a launcher
    can ask before any rank starts (scripts/train.py); the Trainer asks it of every batch."""
    problems = []
    why = (f"sequence length {seq_len} must be >= 1" if seq_len < 1
           else length_problem(seq_len, cp_size, layout))
    if why:
        problems.append(why)
    elif checkpointing == "selective_half" and (seq_len // cp_size) % 2:
        problems.append(f"checkpointing 'selective_half' halves the local sequence; local "
                        f"length {seq_len // cp_size} is odd (use a multiple of {2 * cp_size})")
    if seq_len > config.max_seq_len:
        problems.append(f"sequence length {seq_len} exceeds the config's max_seq_len "
                        f"{config.max_seq_len}")
    return problems


def _containers_copied(tree):
    """``tree`` with new dicts and lists around the same tensors (no tensor is copied)."""
    if isinstance(tree, dict):
        return {k: _containers_copied(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_containers_copied(v) for v in tree]
    return tree


@torch.no_grad()
def _crc(t: torch.Tensor, dtype: torch.dtype) -> int:
    """CRC-32 of ``t``'s bytes as ``dtype`` (cast one tensor at a time): equal for equal
    values, whatever dtype they were given in, and changed by reordering them."""
    data = t.detach().to("cpu", dtype).contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(memoryview(data.numpy()))


class Trainer:
    """Model, optimizer and the CP/DP step.

    Args:
        model_config: a ModelConfig or a config name (``burst.engine.configs.CONFIGS``).
        attention: the attention method (registry signature), None or "burst" for BurstAttention
            with ``backward="auto"`` (the fewer bytes: burst for MHA, ring for small-kv GQA; the
            registry's ``burst`` entry defaults to ``backward="burst"``).
        attention_options: options for every call (``layout``, ``backward``, ...).
        cp_group / dp_group: context-parallel and data-parallel groups (None: the whole world is
            one CP group), forming a grid (every CP group meets every DP group in one rank, and
            the ranks of a CP group share one DP rank: ``parallel.grid_problem``); or
            ``cp_degree`` to build both (CP innermost).
        checkpointing: ``none``, ``full``, ``selective``, ``selective_half`` (striped layout).
        fused_head: fused LM head + cross-entropy in chunks of ``loss_chunk`` tokens.
        window: (left, right) sliding window of every layer's attention, or a list with one
            entry per layer, each (left, right) or None (the whole causal context): a model
            that interleaves local and global layers (``burst.masks.interleaved_windows``).
            None: the config's own (``ModelConfig.window``, e.g. from ``from_hf``); a window
            that differs from a config's own is refused.
        data_parallel: ``ddp`` or ``fsdp`` (torch's) across the DP group; ``fsdp_world``:
            torch's FSDP over every rank, CP included, so that weights, gradients and optimizer
            state are sharded over the world (ZeRO-3: one unit per decoder layer). Where FSDP
            shards a bfloat16 model it keeps fp32 master weights, gradients and AdamW moments
            (``master_weights``) and computes in bfloat16; ddp, and fsdp without a DP group of
            more than one rank (it wraps nothing then), keep all of them in ``dtype``. FSDP
            shards the model before its weights are made: no rank builds it whole (a
            ``state_dict`` given is whole on every rank's host, as it is given).
        state_dict: initial weights with the engine's names (e.g. ``from_hf(...).state_dict()``).
    """

    def __init__(self, model_config: ModelConfig | str, *, attention=None,
                 attention_options: dict | None = None, cp_group=None, dp_group=None,
                 cp_degree: int | None = None, checkpointing: str = "none",
                 fused_head: bool = True, loss_chunk: int = LOSS_CHUNK,
                 dtype: torch.dtype = torch.float32, device="cpu", lr: float = 1e-3,
                 seed: int = 0, window=None,
                 data_parallel: str = "ddp", optimizer: str = "adamw",
                 weight_decay: float = 0.0, state_dict: dict | None = None,
                 ignore_index: int = IGNORE_INDEX):
        # every argument is checked on every rank, then the ranks compare what they found
        # (_agree): a rank that raised alone left the others waiting in the first collective
        problems, kind = [], ValueError
        try:
            cfg = get_config(model_config) if isinstance(model_config, str) else model_config
        except ValueError as e:
            problems.append(str(e))
            cfg = None
        if cfg is not None and not isinstance(cfg, ModelConfig):
            problems.append(f"model_config must be a ModelConfig or a config name, got "
                            f"{type(cfg).__name__}")
            cfg, kind = None, TypeError
        try:
            method, layout = resolve_attention(attention, attention_options)
            check_mode(checkpointing, layout, method)
        except TypeError as e:
            problems.append(str(e))
            method = layout = None
            kind = TypeError
        except ValueError as e:
            problems.append(str(e))
        if isinstance(dtype, str):  # a name, as a spec and scripts/train.py spell it
            dtype = _BY_NAME.get(_dtype_name(dtype), dtype)
        if dtype not in DTYPES:
            problems.append(f"dtype: {dtype_problem(dtype) or f'{dtype!r} is not a torch dtype'}")
        if (not isinstance(loss_chunk, numbers.Integral) or isinstance(loss_chunk, bool)
                or loss_chunk < 1):
            problems.append(f"loss_chunk={loss_chunk!r} must be a whole number of tokens >= 1")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            problems.append(f"seed={seed!r} must be a whole number")
        if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
            # True ran as 1 (every target of token 1 dropped); None and "-100" failed at the
            # first step, -100.0 only without the fused head
            problems.append(f"ignore_index={ignore_index!r} must be a whole number (a token id "
                            "no target uses, e.g. -100)")
        if not _positive_number(lr):
            problems.append(f"lr={lr!r} must be a positive number")
        if not _positive_number(weight_decay, zero=True):
            problems.append(f"weight_decay={weight_decay!r} must be a number >= 0")
        if optimizer not in OPTIMIZERS:
            problems.append(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        if data_parallel not in DATA_PARALLEL:
            problems.append(f"unknown data_parallel {data_parallel!r}; valid: "
                            f"{', '.join(DATA_PARALLEL)}")
        if cfg is not None:  # (without a config: reported above)
            try:  # one form, the model's own where none is given (configs.run_window)
                window = run_window(cfg, window)
            except ValueError as e:
                problems.append(str(e))
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            problems.append(f"device={device!r}, but torch sees no CUDA device here")
        if cp_degree is not None and (cp_group is not None or dp_group is not None):
            problems.append("give either cp_degree or cp_group/dp_group, not both")
        world = comm.world_size()
        if cp_degree is None:  # the (CP, DP) sizes of the groups given (their members are
            groups = [comm.world_size(cp_group),  # the caller's to agree on)
                      comm.world_size(dp_group) if dp_group else 1]
        elif cp_degree_ok(cp_degree, world):
            groups = [cp_degree, world // cp_degree]
        else:  # refused by make_groups on every rank that has it
            groups = ["cp_degree", repr(cp_degree)]
        if not problems and isinstance(groups[0], int):
            # the method on this CP group and model, here rather than at the first step (an
            # engine audit: Ulysses on 3 ranks with 4 heads built a Trainer); the local length
            # is the batch's, checked by each step: 2 meets every layout here
            try:
                check_method(method, attention_options or {}, world=groups[0],
                             heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, seq_local=2)
            except ValueError as e:
                problems.append(str(e))
        # no wrapper without DP, but fsdp_world shards over the CP ranks too
        dp_kind = data_parallel if groups[-1] != 1 or data_parallel == "fsdp_world" else None
        # where FSDP shards the model, it shards it before its weights exist: each rank then
        # allocates its shard alone and fills it with its rows of the same whole values (from
        # a seed it draws only those rows, burst.engine.init; never the whole model on any
        # rank). DDP starts from whole replicas, made before it wraps them
        sharded = dp_kind in ("fsdp", "fsdp_world") and world > 1
        # sharding FSDP keeps fp32 master weights of a 16-bit model and gathers them in the
        # model's dtype (mixed precision, as ZeRO)
        self.master_weights = sharded and dtype in DTYPES and dtype.itemsize == 2
        param_dtype = torch.float32 if self.master_weights else dtype
        model = None
        if cfg is not None and dtype in DTYPES:
            model = CausalLM.skeleton(cfg, param_dtype)
            # the whole weights' names and shapes, whatever wrapper shards them later
            self._weight_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            why = None if state_dict is None else self._weights_problem(state_dict)
            if why:
                problems.append(f"state_dict: {why}")
        # what every rank must run alike: a rank with another causal window, layout, scale,
        # backward or checkpointing mode ran without an error and gave wrong losses and
        # gradients on every rank, or hung in the ring; one with another optimizer, lr or
        # weight decay trained its own copy of the weights; another CP degree or DP wrapper
        # hung in the groups' creation or in DP's first collective. Compared across the world
        # before any group is made (_agree), with the seed or the weights given
        setup = None
        if not problems:
            name = getattr(method, "name", None) or (  # a function: its import path
                f"{getattr(method, '__module__', '')}.{getattr(method, '__qualname__', '')}")
            effective = {**getattr(method, "options", {}), **(attention_options or {})}
            setup = _canonical([name, layout, window, effective, checkpointing, fused_head,
                                int(loss_chunk), str(dtype), repr(cfg), int(ignore_index),
                                optimizer, float(lr), float(weight_decay), dp_kind, groups,
                                # cp_degree on some ranks and groups on others: the former
                                # made groups of their own and every rank hung (a review)
                                cp_degree is not None and cp_degree_ok(cp_degree, world)
                                and cp_degree != world])
        self._setup = setup
        # the groups' members, checked for the grid the engine assumes (parallel.grid_problem:
        # make_groups builds one, groups given by hand were checked for their sizes alone)
        self._members = None  # (a CP degree that does not divide: make_groups refuses it)
        if not problems and world > 1 and (cp_degree is None or cp_degree_ok(cp_degree, world)):
            self._members = grid_place(comm.rank(), world, cp_degree, cp_group, dp_group)
        self._agree(problems, kind, seed, state_dict, param_dtype)

        # numpy integers included
        loss_chunk, seed, ignore_index = int(loss_chunk), int(seed), int(ignore_index)
        self.config, self.layout, self.dtype = cfg, layout, dtype
        self.checkpointing, self.ignore_index = checkpointing, ignore_index
        self.model = model
        self.cp_group, self.dp_group = self._groups(cp_group, dp_group, cp_degree)
        model.attention = AttentionCall(method, layout, dict(attention_options or {}),
                                        self.cp_group, window)
        model.checkpointing, model.fused_head, model.loss_chunk = (checkpointing, fused_head,
                                                                   loss_chunk)
        if not sharded:
            self._fill(seed, state_dict)
        self._forward = wrap_data_parallel(model, self.dp_group, data_parallel,
                                           compute_dtype=dtype, device=self.device)
        if sharded:
            self._fill(seed, state_dict)
        self.shards_world = data_parallel == "fsdp_world" and world > 1
        params = list(model.parameters())
        self.optimizer_name = optimizer
        self._pending_save = None  # save(..., wait=False) until finish_save completes it
        if optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95),
                                               weight_decay=weight_decay)
        else:
            self.optimizer = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)

    def _fill(self, seed: int, state_dict: dict | None) -> None:
        """Give the skeleton model (whole, or FSDP's shards of it) storage on this Trainer's
        device and its values: ``state_dict``'s, else the init drawn from ``seed``."""
        self.model.to_empty(device=self.device)
        if state_dict is None:
            self.model.reset_parameters(seed)
            return
        for name, p in self.model.named_parameters():
            assign_whole(p, state_dict[name])

    def _agree(self, problems: list[str], kind: type, seed, state_dict: dict | None,
               param_dtype: torch.dtype) -> None:
        """Raise on every rank if any rank's arguments are invalid, or if the ranks differ in
        their setup or starting weights: a rank given another ``seed``, or ``state_dict`` on
        rank 0 only, trained without an error on a mix of models (its CP peers' gradients
        summed into different weights; FSDP even assembled one model from the shards of two).
        The weights are made from the seed or the state_dict alone, so those are compared:
        each rank's seed, or a CRC-32 of every given weight as this model will hold it (so
        equal values given in another dtype agree, and reordered ones do not). One all-gather
        of small objects; the rank whose arguments are invalid raises its own error, the
        others a ValueError naming it."""
        mine = "Trainer: " + "; ".join(problems) if problems else None
        if comm.world_size() == 1:
            if mine is not None:
                raise kind(mine)
            return
        summary = None
        if mine is None:
            weights = (None if state_dict is None else
                       [_crc(state_dict[n], param_dtype) for n in self._weight_shapes])
            summary = (self._setup, None if state_dict is not None else int(seed), weights,
                       self._members)
        # a "cuda" device torch cannot see is one of the problems: gathered on the host
        device = (self.device if self.device.type != "cuda" or torch.cuda.is_available()
                  else None)
        with comm.phase("check"):
            theirs = comm.gather_objects((mine, summary), device=device)
        if mine is not None:
            raise kind(mine)
        bad = [(r, m) for r, (m, _) in enumerate(theirs) if m is not None]
        if bad:
            r, m = bad[0]
            raise ValueError(f"Trainer: the arguments of rank {r} are invalid ({m}); every "
                             "rank must be given the same valid arguments")
        setups, seeds, weights, members = zip(*(s for _, s in theirs), strict=True)
        if len(set(setups)) > 1:
            raise ValueError("Trainer: the ranks differ in their setup (attention method, "
                             "options, layout, window, checkpointing, head, dtype, model, "
                             "optimizer, lr, weight decay, data parallel, CP degree or group "
                             "sizes); it must be the same on every rank (this rank: "
                             f"{self._setup[:400]})")
        why = None if None in members else grid_problem(members)
        if why:
            raise ValueError(f"Trainer: cp_group and dp_group do not form a grid: {why}; "
                             "give cp_degree, or groups as burst.engine.parallel.make_groups "
                             "makes them")
        if len({s is None for s in seeds}) > 1:
            why = "a state_dict was given to some ranks only"
        elif len(set(seeds)) > 1:
            why = "their seeds differ"
        elif weights[0] is not None and len(set(map(tuple, weights))) > 1:
            names = list(self._weight_shapes)
            differ = [n for i, n in enumerate(names) if len({w[i] for w in weights}) > 1]
            why = f"{len(differ)} of {len(names)} parameters differ, first {differ[0]!r}"
        else:
            return
        raise ValueError(f"Trainer: the ranks start from different weights ({why}); give "
                         "every rank the same seed and the same state_dict")

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights as plain CPU tensors with the engine's names (FSDP's
        sharded parameters gathered): what ``Trainer(state_dict=...)`` loads, on any layout of
        ranks. A collective under FSDP: every rank calls it. The optimizer's state is in
        ``state_dict()``."""
        return full_state(self.model)[0]

    def state_dict(self) -> dict | None:
        """The whole training state, to resume a run exactly: ``{"model": weights (as
        ``model_state_dict``), "optimizer": its state and hyperparameters keyed by parameter
        name, "optimizer_name": "adamw" | "sgd", "window": the model's sliding window}`` as
        plain CPU tensors, on global rank 0 only (None on the others: no other rank holds a
        whole copy). What ``load_state_dict`` restores on any CP x DP layout and either DP
        wrapper. A collective: every rank calls it."""
        weights, optim = full_state(self.model, self.optimizer, rank0_only=True)
        if comm.rank() != 0:
            return None
        return {"model": weights, "optimizer": optim, "optimizer_name": self.optimizer_name,
                "window": self.window}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore the ``state_dict()`` given on global rank 0 (the other ranks' argument is not
        read; rank 0 broadcasts it): weights and optimizer state, its hyperparameters included
        (the saved lr wins over this Trainer's, as torch's optimizers do); gradients not yet
        applied are dropped. A collective; a state refused on rank 0, or a failure on any
        rank, raises on every rank."""
        head = None
        if comm.rank() == 0:
            try:
                head = {"problem": None, "fresh": hyperparameters(self._check_state(state))}
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                head = {"problem": str(e), "fresh": None}
        head = comm.gather_objects(head, device=self.device)[0]
        if head["problem"]:
            raise ValueError(f"Trainer.load_state_dict: {head['problem']}")
        if comm.rank() == 0:
            self._warn_if_rounded(state["model"])
            self._warn_if_other_window(state)
        # torch's loading sets the state up with a zero-lr step, skipped where gradients wait
        self.optimizer.zero_grad(set_to_none=True)
        # torch's loading puts its shards into the dicts it is given: the caller's stay theirs
        mine = (_containers_copied(state) if comm.rank() == 0
                else {"model": {}, "optimizer": {}})
        error = None
        try:
            load_full_state(self.model, self.optimizer, mine["model"], mine["optimizer"],
                            fresh=head["fresh"])
        except Exception as e:  # noqa: BLE001  (every rank must learn of it)
            error = e
        self._raise_if_any(error, "load_state_dict")

    @property
    def window(self):
        """The model's sliding window (``burst.masks.model_window``'s form): its config's, or
        the one this Trainer was given."""
        return self.model.attention.window

    def _warn_if_other_window(self, saved: dict, who: str = "Trainer.load_state_dict") -> None:
        """A state saved by a run whose model attended through another sliding window (a
        state of before the window was saved: not checked). Its weights fit this model, so
        it loads; the run goes on with this Trainer's window, which may be meant (a longer
        context) or not (a config that lost its window)."""
        if "window" not in saved:
            return
        window = saved["window"]  # in model_window's form, as state_dict gives it
        if window != self.window:
            warnings.warn(f"{who}: the state was saved by a run with window={window!r}; this "
                          f"Trainer's is {self.window!r}, and the run goes on with it (give "
                          "the config or Trainer the saved window to resume that model)",
                          stacklevel=3)

    def _warn_if_rounded(self, weights: dict, who: str = "Trainer.load_state_dict") -> None:
        """A state of other weights than this Trainer keeps: a bfloat16 run's fp32 master
        weights (saved under a sharding FSDP) loaded under ddp are rounded, and the run goes on
        without them; a bfloat16 run's weights loaded under a sharding FSDP become fp32 masters
        the run did not have. Either way its losses are not those it would have had."""
        mine = next(self.model.parameters()).dtype
        floats = {v.dtype for v in weights.values() if v.is_floating_point()}
        wider = sorted(str(d) for d in floats if d.itemsize > mine.itemsize)
        narrower = sorted(str(d) for d in floats if d.itemsize < mine.itemsize)
        if wider:
            warnings.warn(f"{who}: the state's weights are {', '.join(wider)} "
                          f"(fp32 master weights of a run under a sharding FSDP), this Trainer "
                          f"keeps {mine}: they are rounded to it and the run goes on without "
                          "master weights (its losses drift from the run it resumes); resume "
                          "under the same data_parallel to keep them", stacklevel=2)
        elif narrower and self.master_weights:
            warnings.warn(f"{who}: the state's weights are "
                          f"{', '.join(narrower)} (a run that kept no master weights), this "
                          f"Trainer keeps {mine} master weights (a sharding FSDP): made from "
                          "the state's and the run goes on with them (its losses drift from "
                          "the run it resumes); resume under the same data_parallel to keep "
                          "its precision", stacklevel=2)

    def _check_state(self, state) -> dict:
        """``state["optimizer"]`` of a well-formed state for this Trainer; raises why not."""
        if not isinstance(state, dict) or any(k not in state for k in
                                              ("model", "optimizer", "optimizer_name")):
            have = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a Trainer.state_dict() (it has {have}); weights alone load "
                             "with Trainer(state_dict=...)")
        if state["optimizer_name"] != self.optimizer_name:
            raise ValueError(f"the state is of a {state['optimizer_name']!r} optimizer, this "
                             f"Trainer's is {self.optimizer_name!r}")
        optim = state["optimizer"]
        if (not isinstance(state["model"], dict) or not isinstance(optim, dict)
                or not isinstance(optim.get("param_groups"), list)):
            raise ValueError("not a Trainer.state_dict(): 'model' must be a dict of tensors "
                             "and 'optimizer' a dict with 'param_groups'")
        why = self._weights_problem(state["model"])  # before anything is copied: torch's own
        if why:  # loading copies every weight that fits before it raises for the others
            raise ValueError(why)
        return optim

    def _weights_problem(self, weights) -> str | None:
        """Why ``weights`` are not this model's whole weights (names and shapes), else None."""
        if not isinstance(weights, dict):
            return f"weights must be a dict of tensors, got {type(weights).__name__}"
        if {"model", "optimizer", "optimizer_name"} <= set(weights):
            return ("this is a Trainer.state_dict() (weights and optimizer): load it with "
                    "Trainer.load_state_dict, or give its 'model' entry")
        not_tensors = sorted(k for k, v in weights.items() if not isinstance(v, torch.Tensor))
        if not_tensors:
            return f"not tensors: {', '.join(map(str, not_tensors[:5]))}"
        from torch.distributed.tensor import DTensor

        shards = sorted(k for k, v in weights.items() if isinstance(v, DTensor))
        if shards:
            return (f"{len(shards)} sharded tensors (DTensor), first {shards[0]!r} (an FSDP "
                    "model's own state_dict()): give whole weights, as "
                    "Trainer.model_state_dict() returns them")
        empty = sorted(k for k, v in weights.items() if v.is_meta)
        if empty:
            return f"{len(empty)} meta tensors (no values), first {empty[0]!r}"
        mine = self._weight_shapes

        def few(names, sep=", "):
            return sep.join(names[:3]) + (f"{sep}..." if len(names) > 3 else "")

        problems = []
        missing, extra = sorted(set(mine) - set(weights)), sorted(set(weights) - set(mine))
        if missing:
            problems.append(f"{len(missing)} missing ({few(missing)})")
        if extra:
            problems.append(f"{len(extra)} unknown ({few(extra)})")
        wrong = [f"{k} {tuple(weights[k].shape)} (this model: {mine[k]})"
                 for k in sorted(set(mine) & set(weights)) if tuple(weights[k].shape) != mine[k]]
        if wrong:
            problems.append(f"{len(wrong)} of another shape: {few(wrong, '; ')}")
        if problems:
            return ("the weights are not this model's (another size or model?): "
                    + "; ".join(problems) + "; nothing was loaded")
        return None

    def save(self, path, meta: dict | None = None, *, sharded: bool = False,
             wait: bool = True) -> None:
        """Write ``state_dict()`` to one file, with ``meta`` (plain values: the caller's step,
        arguments) that ``load`` returns: global rank 0 writes ``<path>.tmp`` and renames it,
        so a run killed while saving keeps the previous file whole. A collective; it returns
        on every rank once the file is complete, and raises on every rank if the write
        failed.

        ``sharded``: every rank writes the shards it holds instead (torch.distributed.checkpoint;
        no rank gathers the state, so rank 0's memory does not grow with the model), into one
        of two folders beside ``path``, which becomes a link to the one just written (the
        other keeps the save before it): ``burst.engine.sharded_state``. Every rank must see
        ``path`` (a shared filesystem across nodes).

        ``wait=False`` (sharded only): return once each rank has copied its state to host
        memory; the files are written in the background while training goes on, and
        ``finish_save()`` completes the save (checks the files, replaces the link). The next
        ``save`` or ``load`` calls it first; call it before the process ends, or what was
        written is never published and the link keeps naming the save before."""
        if wait is not True and wait is not False:
            raise TypeError(f"wait={wait!r}: True or False")
        if not wait and not sharded:
            raise ValueError("save(..., wait=False) needs sharded=True: the one-file state is "
                             "gathered and written by rank 0 alone")
        path = Path(path)
        self.finish_save()
        if sharded:
            return self._save_sharded(path, meta, wait)
        state, error = self.state_dict(), None
        if comm.rank() == 0:
            tmp = path.with_name(f"{path.name}.tmp")
            try:
                _check_plain(meta or {}, "meta")  # what load's weights_only reader takes
                sharded_state.save_with_crcs({**state, "meta": dict(meta or {})}, tmp)
                os.replace(tmp, path)
            except Exception as e:  # noqa: BLE001  (every rank must learn of it)
                tmp.unlink(missing_ok=True)
                error = e
        self._raise_if_any(error, f"the save to {path}")

    def load(self, path) -> dict:
        """``load_state_dict`` of a file that ``save`` wrote, read by global rank 0 alone;
        returns the ``meta`` saved with it, on every rank. A file rank 0 cannot read raises on
        every rank, and so does one changed since it was written: every record's CRC-32 (which
        torch.save stores in its zip and torch.load does not check) is checked first, a second
        read of the file (bit rot or a bad copy otherwise resumed, silently, from wrong
        weights). The file is memory-mapped (copy-on-write), not read into rank 0's memory
        whole: a 2.2 GiB state's load peaked at 3.4 GiB of anonymous memory instead of 5.7,
        and the optimizer's moments stay file pages until the next step writes them, so the
        file must not be overwritten in place (``save`` replaces it) before that step.
        A ``path`` that is a folder (or the link to one) is a state ``save(..., sharded=True)``
        wrote: every rank reads the slices it needs, after a check of every file's CRC-32
        (each rank a share of the files); torch.distributed.checkpoint unpickles parts of it,
        so load only sharded states you trust."""
        self.finish_save()
        # rank 0 decides, for every rank: a rank that does not see the folder took it for a
        # file and the ranks' collectives no longer matched (a TypeError, or a hang; an audit)
        if comm.gather_objects(sharded_state.is_sharded(path) if comm.rank() == 0 else None,
                               device=self.device)[0]:
            return self._load_sharded(Path(path))
        state, error = None, None
        if comm.rank() == 0:
            try:
                sharded_state.check_zip_crcs(path)
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            # a missing or unreadable file: as the OS says it
            except (OSError, sharded_state.Changed) as e:
                error = e
            except Exception as e:  # noqa: BLE001  (every rank must learn of it)
                # torch's own words for a file of another kind are "KeyError: 101" and the like
                error = ValueError(f"{path} is not a file Trainer.save wrote "
                                   f"({type(e).__name__}: {e})")
        self._raise_if_any(error, f"the load of {path}")
        self.load_state_dict(state)
        meta = state.get("meta", {}) if isinstance(state, dict) else None
        return comm.gather_objects(meta, device=self.device)[0]

    def finish_save(self) -> None:
        """Complete the pending ``save(..., sharded=True, wait=False)``: wait for its files,
        check them and replace the link. A collective; nothing happens when none is pending. A
        write that failed raises here, on every rank (the link keeps naming the save before)."""
        if self._pending_save is None:
            return
        (path, folder, meta, hyper, future), self._pending_save = self._pending_save, None
        error = None
        try:
            future.result()
        except SAVE_ERRORS as e:  # every rank must learn of it
            error = e
        finally:
            sharded_state.writing(folder, False)
        self._raise_if_any(error, f"the save to {path}")
        self._publish_sharded(path, folder, meta, hyper)

    def _save_sharded(self, path: Path, meta: dict | None, wait: bool) -> None:
        what, folder, error = f"the save to {path}", None, None
        if comm.rank() == 0:
            try:
                _check_plain(meta or {}, "meta")
                folder = sharded_state.target_folder(path)
                sharded_state.prepare(folder)
                # named absolutely, as a load does: a rank in another working directory wrote
                # a relative path's shards elsewhere
                folder = os.path.abspath(folder)
            except Exception as e:  # noqa: BLE001  (every rank must learn of it)
                error = e
        self._raise_if_any(error, what)
        folder = Path(comm.gather_objects(folder and str(folder), device=self.device)[0])
        hyper = None
        if wait:
            try:  # an optimizer without per-parameter state: its hyperparameters go into info.pt
                hyper = save_local_state(self.model, self.optimizer, folder)
            except SAVE_ERRORS as e:
                error = e
            self._raise_if_any(error, what)
            self._publish_sharded(path, folder, meta, hyper)
            return
        staged, future = None, None
        try:
            hyper, staged = stage_local_state(self.model, self.optimizer)
        except SAVE_ERRORS as e:
            error = e
        # every rank holds its copy before any starts a write whose collectives wait for all
        self._raise_if_any(error, what)
        try:
            future = write_staged(staged, folder)
        except SAVE_ERRORS as e:
            error = e
        self._raise_if_any(error, what)
        # meta as it is now (a caller may change its own dict before finish_save publishes it)
        self._pending_save = (path, folder, copy.deepcopy(dict(meta or {})), hyper, future)
        sharded_state.writing(folder, True)

    def _publish_sharded(self, path: Path, folder: Path, meta: dict | None, hyper) -> None:
        """Every rank's files written: their CRC-32s gathered, then ``info.pt`` and the link."""
        what, crcs, error = f"the save to {path}", None, None
        try:
            crcs = sharded_state.gather_crcs(folder, device=self.device)
        except Exception as e:  # noqa: BLE001
            error = e
        self._raise_if_any(error, what)
        if comm.rank() == 0:
            try:
                sharded_state.publish(path, folder, {
                    "format": 1, "meta": dict(meta or {}), "optimizer_name": self.optimizer_name,
                    "fresh": hyper, "crcs": crcs, "window": self.window})
            except Exception as e:  # noqa: BLE001
                error = e
        self._raise_if_any(error, what)

    def _load_sharded(self, path: Path) -> dict:
        # the folder the link names, read by rank 0 alone: every rank loads that one save,
        # should another process save meanwhile or a node see an older link
        folder, error = None, None
        if comm.rank() == 0:
            try:
                folder = os.path.abspath(sharded_state.resolve(path))  # (rank 0's cwd)
            except (OSError, ValueError) as e:
                error = e
        self._raise_if_any(error, f"the load of {path}")
        folder = Path(comm.gather_objects(folder, device=self.device)[0])
        info, weights = None, None
        try:  # every file's CRC-32 before any is unpickled (each rank a share of the files)
            info = sharded_state.read_info(folder)
            bad = sharded_state.crc_problems(folder, info["crcs"], comm.rank(),
                                             comm.world_size())
            if bad:
                raise sharded_state.Changed(
                    f"{folder} was changed after Trainer.save wrote it: {'; '.join(bad[:3])}; "
                    "nothing was loaded (resume from another copy of the state"
                    + (f", such as the save before it, {sharded_state.fallback(path)}, "
                       "if it is whole" if path.is_symlink() else "") + ")")
        except Exception as e:  # noqa: BLE001  (every rank must learn of it)
            error = e
        # every rank's verdict before any rank unpickles DCP's .metadata (another rank's
        # share of the files may be the one that changed)
        self._raise_if_any(error, f"the load of {path}")
        try:
            if info["optimizer_name"] != self.optimizer_name:
                raise ValueError(f"the state is of a {info['optimizer_name']!r} optimizer, "
                                 f"this Trainer's is {self.optimizer_name!r}")
            weights = sharded_state.saved_weights(folder)
            why = self._weights_problem(weights)
            if why:
                raise ValueError(why)
        except Exception as e:  # noqa: BLE001  (every rank must learn of it)
            error = e
        self._raise_if_any(error, f"the load of {path}")
        if comm.rank() == 0:
            self._warn_if_rounded(weights, "Trainer.load")
            self._warn_if_other_window(info, "Trainer.load")
        self.optimizer.zero_grad(set_to_none=True)  # gradients not yet applied: dropped
        try:  # "fresh": the hyperparameters of an optimizer saved before its first step
            load_local_state(self.model, self.optimizer, folder, fresh=info["fresh"])
        except Exception as e:  # noqa: BLE001
            error = e
        self._raise_if_any(error, f"the load of {path}")
        return info["meta"]

    def _raise_if_any(self, error: Exception | None, what: str) -> None:
        """A rank's ``error`` raised there, and as a RuntimeError quoting the first failed
        rank's on every other rank (one all-gather of the error texts)."""
        texts = comm.gather_objects(
            None if error is None else f"{type(error).__name__}: {error}", device=self.device)
        if error is not None:
            raise error
        failed = [(r, t) for r, t in enumerate(texts) if t is not None]
        if failed:
            r, text = failed[0]
            raise RuntimeError(f"Trainer: {what} failed on rank {r}: {text}")

    # -- groups ---------------------------------------------------------------------------------

    @staticmethod
    def _groups(cp_group, dp_group, cp_degree):
        world = comm.world_size()
        if cp_degree is not None:  # not with groups: refused with the other arguments
            return make_groups(cp_degree, world)
        cp, dp = comm.world_size(cp_group), comm.world_size(dp_group) if dp_group else 1
        if cp * dp != world:
            raise ValueError(
                f"Trainer: context-parallel group of {cp} ranks x data-parallel group of {dp} "
                f"does not cover the world of {world} ranks; pass a dp_group with "
                f"{world // cp if world % cp == 0 else '?'} ranks, or cp_degree (valid: "
                f"{', '.join(map(str, divisors(world)))})")
        return cp_group, dp_group

    @property
    def cp_size(self) -> int:
        return comm.world_size(self.cp_group)

    @property
    def cp_rank(self) -> int:
        return comm.rank(self.cp_group)

    @property
    def dp_size(self) -> int:
        return comm.world_size(self.dp_group) if self.dp_group is not None else 1

    @property
    def dp_rank(self) -> int:
        return comm.rank(self.dp_group) if self.dp_group is not None else 0

    # -- data -----------------------------------------------------------------------------------

    def _check_seq_len(self, seq_len: int) -> None:
        problems = seq_len_problems(self.config, seq_len, cp_size=self.cp_size,
                                    layout=self.layout, checkpointing=self.checkpointing)
        if problems:
            raise ValueError("Trainer: " + "; ".join(problems))

    def local_batch(self, seq_len: int, batch: int = 1, seed: int = 0, *, cu_seqlens=None):
        """This rank's (tokens, targets, positions), each (batch, seq_len / cp), generated at
        this rank's global indices (no rank builds the whole sequence). DP replicas get
        different sequences."""
        bad = [f"{name}={v!r} must be a whole number >= 1" for name, v in
               (("seq_len", seq_len), ("batch", batch))
               if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1]
        if bad:  # 8.0 gave float positions, 0 empty tensors that step() refused later
            raise ValueError("Trainer.local_batch: " + "; ".join(bad))
        self._check_seq_len(seq_len)
        t = local_batch(seq_len=seq_len, batch=batch, seed=seed, vocab=self.config.vocab_size,
                        layout=self.layout, world=self.cp_size, rank=self.cp_rank,
                        seq_offset=self.dp_rank * batch, cu_seqlens=cu_seqlens,
                        ignore_index=self.ignore_index)
        return tuple(x.to(self.device) for x in t)

    def shard_batch(self, tokens, targets, positions):
        """This rank's shard of full (batch, seq_len) tensors, in the attention's layout."""
        shapes = [tuple(getattr(t, "shape", ())) for t in (tokens, targets, positions)]
        if any(len(sh) != 2 for sh in shapes) or len(set(shapes)) != 1:
            raise ValueError(f"Trainer.shard_batch: tokens, targets and positions must be "
                             f"(batch, seq_len) tensors of one shape, got {shapes}")
        self._check_seq_len(tokens.shape[1])
        # on the Trainer's device, as local_batch's (a CPU loader's shards went on to
        # global_targets' all-reduce, which NCCL refuses for CPU tensors)
        return tuple(t.to(self.device) for t in shard_batch(
            tokens, targets, positions, layout=self.layout, group=self.cp_group))

    # -- step -----------------------------------------------------------------------------------

    def _check_batch(self, tokens, targets, positions, cu_seqlens=None,
                     num_targets=None) -> None:
        """Each rank's input checked alone, then compared: the shard shapes, cu_seqlens and
        num_targets across the CP group, num_targets across the DP groups (the setup was
        compared across the world when the Trainer was built, ``_agree``). Every rank takes
        part in both comparisons, so an input that fails on one rank raises on every rank (it
        raised on that rank alone, and its peers waited in the ring or in DDP's all-reduce
        until the process group's timeout)."""
        problems = self._local_problems(tokens, targets, positions, cu_seqlens)
        if num_targets is not None and (isinstance(num_targets, bool)
                                        or not isinstance(num_targets, int)):
            # here, not with the count below: 10000 on one rank and np.int64(10000) on another
            # compare equal, and the other ranks then waited in the ring
            problems.append(f"num_targets={num_targets!r}: expected an int >= this call's "
                            "target tokens (and >= 1)")
        bad = float(bool(problems))
        b, n = (0, 0) if problems else tokens.shape
        if self.cp_size > 1:  # each shard may be valid alone; the ring needs them all alike
            # the documents and the loss's denominator, as a 32-bit checksum (exact in
            # float64): one max all-reduce of 8 numbers compares shapes and both
            call = _canonical([None if cu_seqlens is None or problems else
                               [int(x) for x in cu_seqlens], num_targets])
            f = zlib.crc32(call.encode())
            shapes = torch.tensor([b, n, f, bad, -b, -n, -f, -bad], dtype=torch.float64,
                                  device=self.device)
            with comm.phase("check"):
                comm.all_reduce(shapes, group=self.cp_group, op="max")
            hi_b, hi_n, hi_f, bad, lo_b, lo_n, lo_f, _ = (int(x) for x in shapes.tolist())
        if self.dp_size > 1:  # the loss's denominator is the whole global batch's
            g = zlib.crc32(_canonical(num_targets).encode())
            across = torch.tensor([g, bad, -g], dtype=torch.float64, device=self.device)
            with comm.phase("check"):
                comm.all_reduce(across, group=self.dp_group, op="max")
            hi_g, bad, lo_g = (int(x) for x in across.tolist())
        if problems:
            raise ValueError("Trainer.step: " + "; ".join(problems))
        if bad:
            raise ValueError("Trainer.step: another rank's input is invalid (its error says "
                             "why); this rank's is valid")
        if self.cp_size > 1:
            if (hi_b, hi_n) != (-lo_b, -lo_n):
                raise ValueError(f"Trainer.step: the shards of one context-parallel group must "
                                 f"have one shape; this rank has batch {b} x {n} local tokens, the "
                                 f"group's shards batch {-lo_b}-{hi_b} x {-lo_n}-{hi_n} tokens")
            if hi_f != -lo_f:
                raise ValueError("Trainer.step: the ranks of one context-parallel group differ "
                                 "in their cu_seqlens or their num_targets; each must be the "
                                 f"same on every rank of the group (this rank: {call[:300]})")
        if self.dp_size > 1 and hi_g != -lo_g:
            raise ValueError(f"Trainer.step: num_targets={num_targets!r} differs across the "
                             "data-parallel groups; it counts the whole global batch's targets, "
                             "so it is the same on every rank")

    def _local_problems(self, tokens, targets, positions, cu_seqlens) -> list[str]:
        problems = []
        for name, t in (("tokens", tokens), ("targets", targets), ("positions", positions)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.int64:
                problems.append(f"{name} must be an int64 tensor (batch, local tokens), got "
                                f"{getattr(t, 'dtype', type(t).__name__)} "
                                f"{tuple(getattr(t, 'shape', ()))}")
        if not problems and not (tokens.shape == targets.shape == positions.shape):
            problems.append(f"tokens {tuple(tokens.shape)}, targets {tuple(targets.shape)} and "
                            f"positions {tuple(positions.shape)} must have the same shape")
        if not problems and (away := [f"{name} on {t.device}" for name, t in (
                ("tokens", tokens), ("targets", targets), ("positions", positions))
                if not _on(t.device, self.device)]):  # failed in the model on that rank alone
            problems.append(f"{', '.join(away)}, not on the Trainer's device {self.device}: "
                            "move them there (.to(trainer.device); local_batch and shard_batch "
                            "return them there)")
        if not problems and tokens.numel() == 0:  # crashed in the model, its DP peers waiting
            problems.append(f"an empty batch {tuple(tokens.shape)}: every rank needs at least "
                            "one row of tokens (a data-parallel group without data has none "
                            "to give DDP/FSDP's collectives)")
        if problems:
            return problems
        cfg = self.config
        try:
            self._check_seq_len(tokens.shape[1] * self.cp_size)
            self.model.attention.check(heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                                       seq_local=tokens.shape[1])
            if cu_seqlens is not None:
                MaskSpec(causal=True, cu_seqlens=cu_seqlens).check_length(
                    tokens.shape[1] * self.cp_size)
        except ValueError as e:
            problems.append(str(e).removeprefix("Trainer: "))
        return problems

    def global_targets(self, targets, tokens=None) -> int:
        """Target tokens (not ``ignore_index``) of this batch on every rank of the world (CP x
        DP): sum it over micro-batches for ``forward_backward``'s ``num_targets``.

        The same reduction counts target ids (and, given ``tokens``, token ids) outside the
        vocabulary on any rank, so that every rank raises, instead of the one rank whose
        embedding or loss fails while its peers wait in the ring."""
        vocab = self.config.vocab_size
        valid = targets != self.ignore_index
        stats = [valid.sum(), (((targets < 0) | (targets >= vocab)) & valid).sum()]
        if tokens is not None:
            stats.append(((tokens < 0) | (tokens >= vocab)).sum())
        stats = torch.stack(stats).to(self.device, torch.float64)  # (NCCL: no CPU tensors)
        with comm.phase("loss"):
            comm.all_reduce(stats)
        counts = stats[1:].tolist()
        bad = [f"{int(x)} {what}" for x, what in zip(counts, ("target ids", "token ids")[
            :len(counts)], strict=True) if x]
        if bad:
            raise ValueError(f"Trainer.step: {' and '.join(bad)} outside [0, {vocab}) on the "
                             f"ranks of this step (targets may also be {self.ignore_index})")
        return int(stats[0].item())

    def forward_backward(self, tokens, targets, positions, *, cu_seqlens=None,
                         num_targets: int | None = None) -> float:
        """Forward, backward and gradient synchronisation (no optimizer step); returns the
        global mean loss. Gradients are added to those already in ``model.parameters()``
        (micro-batch accumulation: each call's gradients are synchronised once).

        ``num_targets``: the number of target tokens the loss is averaged over, when it is more
        than this call's (every micro-batch of an accumulated step, on every rank): the call
        then returns, and back-propagates, its share of that mean, so that the shares of the
        micro-batches add up to the mean over all their tokens, however unevenly the ignored
        targets fall. Default: this call's own global count (each call's own mean).

        Every rank makes the same calls: the same number per step (it is not compared: a rank
        with fewer calls waits in the next collective until the process group's timeout), with
        one cu_seqlens per context-parallel group and one num_targets everywhere
        (compared, with the shard shapes, in small all-reduces: a difference, or an input that
        fails its checks on one rank, raises on every rank)."""
        self._check_batch(tokens, targets, positions, cu_seqlens, num_targets)
        acc = torch.float64
        count = self.global_targets(targets, tokens)
        if num_targets is None and count == 0:
            raise ValueError("Trainer.step: the global batch has no target token (all ignored)")
        if num_targets is not None:
            if num_targets < max(1, count):
                raise ValueError(f"num_targets={num_targets!r}: expected an int >= this call's "
                                 f"{count} target tokens (and >= 1)")
            count = num_targets
        self.model.cache.clear()
        # gradients accumulated by earlier calls are already summed over the CP group: set
        # them aside so that only this call's partial sums are reduced, then add them back
        params = list(self.model.parameters())
        earlier = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            loss = self._forward(tokens, positions, targets, loss_scale=1.0 / count,
                                 cu_seqlens=cu_seqlens, ignore_index=self.ignore_index)
            # DP wrappers average over the DP group; the loss is already the global mean's share
            # (fsdp_world averages over every rank, CP included)
            scale = comm.world_size() if self.shards_world else self.dp_size
            with comm.unlabelled_phase("backward"):  # a user's attention sends unlabelled
                (loss * scale).backward()
            if len(self.model.cache):
                raise AssertionError(f"{len(self.model.cache)} cached attention entries were "
                                     "not consumed by backward")
            if not self.shards_world:
                all_reduce_grads(params, self.cp_group)
        except BaseException:  # a failed call leaves the gradients of earlier calls as they were
            self.model.cache.clear()
            for p, g in zip(params, earlier, strict=True):
                p.grad = g
            raise
        with torch.no_grad():
            for p, g in zip(params, earlier, strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad.add_(g)
        total = loss.detach().to(acc).reshape(1)
        with comm.phase("loss"):
            comm.all_reduce(total)
        return float(total.item())

    def step(self, tokens, targets, positions, *, cu_seqlens=None) -> float:
        """One training step on this rank's shard; returns the global mean loss (before the
        update). A loss that is not finite (the global one: every rank sees it) raises
        FloatingPointError on every rank before the update, with the weights unchanged (the
        update made every weight NaN, silently)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(tokens, targets, positions, cu_seqlens=cu_seqlens)
        if not math.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"Trainer.step: the loss is {loss} (a NaN or inf on some "
                                     "rank); the step was not applied, the weights are as before")
        self.optimizer.step()
        return loss


_PLAIN = (type(None), bool, int, float, str)


def _check_plain(value, where: str) -> None:
    """Refuse what ``torch.load(weights_only=True)`` cannot read back (a numpy scalar, a Path,
    an object): ``save`` would write a file that ``load`` refuses, over the last good one."""
    if type(value) in _PLAIN:
        return
    if type(value) in (list, tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    if type(value) is dict:
        for k, v in value.items():
            _check_plain(k, f"{where} key {k!r}")
            _check_plain(v, f"{where}[{k!r}]")
        return
    raise ValueError(f"{where} is of type {type(value).__name__} ({value!r}): Trainer.save keeps "
                     "plain values (None, bool, int, float, str and lists, tuples and dicts "
                     "of them) that load can read back; nothing was saved")
