"""Imports every adapter module so that each registers its methods (see ``registry``)."""

from baselines import burst_method  # noqa: F401
