"""The argparse types the scripts share: a bad number is a one-line usage error (exit 2),
not a traceback from deep inside a run."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _finite(text: str, ok, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {what}")
    return value


def positive_float(text: str) -> float:
    return _finite(text, lambda x: x > 0, "> 0")


def nonnegative_float(text: str) -> float:
    return _finite(text, lambda x: x >= 0, ">= 0")
