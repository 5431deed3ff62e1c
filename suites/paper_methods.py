"""The one place where the BurstEngine paper's method names become registry names and options.

The paper's tables (``results/paper_reference/*.csv``, column ``method``) name systems, not
algorithms; each maps to the registry entry that implements the same algorithm here:

  megatron_cp            Megatron-LM context parallel = TransformerEngine's p2p ring with the
                         zigzag load balance, dK/dV travelling in the input dtype
                                                  -> zigzag_ring, grad_acc = input
  deepspeed_ulysses      head-parallel all-to-all                   -> ulysses
  loongtrain_double_ring InternEvo's two-level ring (context parallel only)
                                                                    -> double_ring, L = G/4
  loongtrain_usp         InternEvo's head x context parallel: Ulysses inside a node
                                                                    -> usp, degree = node
  burst                  BurstAttention alone (the kernel table)    -> burst, double ring,
                                                                       grad_acc = input
  burstengine            BurstAttention ring (optimised backward, topology-aware double ring)
                         + fused LM head/loss                -> burst, grad_acc = input,
                                                                + fused_head
  burstengine_usp        Ulysses inside a node, BurstAttention across nodes
                                 -> usp, backward = burst, grad_acc = input, + fused_head

Checkpointing (paper README): the paper's ``selective`` is every layer recomputed except the
attention output and LSE (our ``selective``); its ``none`` ("w/o sele-ckpt") is full layer
recomputation (our ``full``): ``results.paper.CHECKPOINTING``.

Checked against the paper's own scripts (thunlp/BurstEngine ``evaluation/``): InternEvo's inner
ring in training is its window of cp/4 GPUs (``baselines/InternEvo/configs/7B_llama2.py``:
``window_size = cp_size // 4`` without head parallelism), as modelled ("@world/4"): one node on
32 GPUs, two on 64 (each window's inner ring then crosses a NIC), a flat ring on 4, no window
below 4 (those cells are skipped). The kernel benchmark's inner ring is the node
(``kernel_bench/benchmark_doublering.py``), the same 8 GPUs on its 32.

One known deviation: InternEvo's USP training runs use head parallel = number of nodes with a
context ring of 8 (``baselines/InternEvo/exp.sh``: cp 8, hp = 8 x nodes / 8), so
U = 4 on 32 GPUs, while the kernel benchmark uses U = 8 (``kernel_bench/bench_usp.sh``). Priced
with U = 4, the 32-GPU training rows move by under 0.5% and their memory not at all, so both
tables use U = node here.

BurstEngine's dQ travels in the input dtype (Burst-Attention/burst_attn/burst_attn_interface.py,
OpBurstAttn.backward: ``dq = torch.zeros_like(q)``, sent as is), hence grad_acc = input for its
three systems (Burst-USP's ring is the same burst_attn).

"@node" in an option stands for the cell's ranks per node, "@world/4" for its world size over 4
(``suites.cells.placeholder_value``), so one entry serves 32 and 64 GPU runs alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PAPER_METHODS", "PaperMethod", "paper_method"]


@dataclass(frozen=True)
class PaperMethod:
    name: str
    """Registry name."""
    label: str
    """The label a spec's row gets when it names none: the main table's (burstengine_main.csv),
    except ``burst``, the kernel table's "BurstAttention" (the kernel table calls the others
    Megatron-CP and LoongTrain-DoubleRing, so paper_kernel_32gpu sets its labels itself)."""
    options: dict = field(default_factory=dict)
    checkpointing: str = "selective"
    fused_head: bool = False


PAPER_METHODS: dict[str, PaperMethod] = {
    # TransformerEngine's dK/dV travel in the input dtype (context_parallel.py: buffers from
    # empty_like(kv)); the option prices them so in the bytes, the time and the memory
    "megatron_cp": PaperMethod("zigzag_ring", "Megatron", {"grad_acc": "input"}),
    "deepspeed_ulysses": PaperMethod("ulysses", "Deepspeed-Ulysses"),
    # LoongTrain (arXiv 2406.18485): K/V and fp32 dK/dV travel (the registry's double_ring and
    # usp run that ring backward by default), zigzag balance (their default layout, set for usp)
    "loongtrain_double_ring": PaperMethod("double_ring", "LoongTrain-Ring",
                                          {"ranks_per_node": "@world/4"}),
    "loongtrain_usp": PaperMethod("usp", "LoongTrain-USP",
                                  {"ulysses_degree": "@node", "layout": "zigzag"}),
    "burst": PaperMethod("burst", "BurstAttention",
                         {"layout": "zigzag", "backward": "burst", "ranks_per_node": "@node",
                          "grad_acc": "input"}),
    "burstengine": PaperMethod("burst", "Burst-Ring",
                               {"layout": "zigzag", "backward": "burst",
                                "ranks_per_node": "@node", "grad_acc": "input"},
                               fused_head=True),
    "burstengine_usp": PaperMethod("usp", "Burst-USP",
                                   {"ulysses_degree": "@node", "layout": "zigzag",
                                    "backward": "burst", "grad_acc": "input"}, fused_head=True),
}


def paper_method(name: str) -> PaperMethod:
    if not isinstance(name, str) or name not in PAPER_METHODS:  # (a list: unhashable)
        raise ValueError(f"unknown paper method {name!r}; valid: {', '.join(PAPER_METHODS)}")
    return PAPER_METHODS[name]
