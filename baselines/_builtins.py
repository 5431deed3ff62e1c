"""Imports every adapter module so that each registers its methods (see ``registry``).

The import order is the registry order (tables list BurstAttention first, then the baselines).
"""
# isort: skip_file

from baselines import burst_method  # noqa: F401
from baselines import ring_family  # noqa: F401
from baselines import double_ring  # noqa: F401
from baselines import allgather  # noqa: F401
from baselines import ulysses  # noqa: F401
from baselines import usp  # noqa: F401
from baselines import tp  # noqa: F401
from baselines import external  # noqa: F401
