"""A `lab` subcommand that fails the way a bug would (for the exit-code test of lab.cli)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("crash-for-test")
    p.set_defaults(func=_crash)


def _crash(args: argparse.Namespace) -> int:
    raise ZeroDivisionError("a bug of ours")
