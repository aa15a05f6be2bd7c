"""Converters for argparse's ``type=``: each turns the text of one option into its value or
raises ValueError with a message that :func:`argument_type` reports as that option's error."""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from knng.cli.choices import EMBED_EPSILON_RULES

__all__ = [
    "argument_type", "positive_int", "non_negative_seconds", "positive_seconds", "epsilon", "alpha",
    "diffusion_time",
]


def argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` that reports ``parse``'s ValueError as the argument's error."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"must be a number of seconds ≥ 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    return value


def epsilon(text: str) -> float | str:
    """``--epsilon``: a rule name or a bandwidth > 0."""
    if text in EMBED_EPSILON_RULES:
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be auto, bgh, self_tuning or a number > 0, got {text!r}")
    return value


def alpha(text: str) -> float:
    """``--alpha``: the density normalisation, in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be a number in [0, 1], got {text}")
    return value


def diffusion_time(text: str) -> float:
    """``--t``: the diffusion time, ≥ 0."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a number ≥ 0, got {text}")
    return value
