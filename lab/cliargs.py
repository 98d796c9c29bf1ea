"""Argument types the lab's commands share (argparse), each refusing with a named error."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole(lo: int, hi: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of `what` within lo..hi, else a named error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number of {what}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{lo} to {hi} {what}, got {value}")
        return value

    return parse
