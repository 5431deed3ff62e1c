"""Imports every adapter module so that each registers its methods (see ``registry``).

``MODULES`` is also the registry order (BurstAttention first, then the baselines), whatever
module a caller happened to import first.
"""

from __future__ import annotations

import importlib

MODULES = ("burst_method", "ring_family", "double_ring", "allgather", "ulysses", "usp", "tp",
           "external")

for _name in MODULES:
    importlib.import_module(f"baselines.{_name}")
