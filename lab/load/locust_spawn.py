"""A Locust worker's spawn message, made cheap to receive.

Locust's `WorkerRunner` (2.x, `runners.py`, the `spawn` case of `handle_message`) keeps
the master's custom options with a comprehension whose condition calls
`argument_parser.default_args_dict()` once per option in the message: every call builds
Locust's whole argument parser (configargparse, ~60 options) and parses an empty
command line. A spawn message has ~60 options, and the master sends one to each worker
every dispatch step of a ramp (each second), so a ramping worker built ~60 parsers a
second: a py-spy profile of a worker while 3,000 clients arrived at 50/s put 48 % of its
samples in `handle_message`, most of it in `default_args_dict` (about a third of a core
per worker, more than its clients cost). The defaults it returns depend only on Locust's
own options and this process's environment, neither of which changes while it runs, so
they are built once and a copy handed out each time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from locust import argument_parser

_CACHED_MARK = "_lab_cached"


def cache_default_args() -> bool:
    """Make `locust.argument_parser.default_args_dict` build its answer once per process.
    Returns False (and changes nothing) if this Locust has no such function."""
    original: Callable[[], dict[str, Any]] | None = getattr(argument_parser, "default_args_dict", None)
    if original is None:
        return False
    if getattr(original, _CACHED_MARK, False):
        return True
    built: dict[str, Any] = {}

    def default_args_dict() -> dict[str, Any]:
        if not built:
            built.update(original())
        return dict(built)  # a copy: a caller that changes its dict changes no one else's

    setattr(default_args_dict, _CACHED_MARK, True)
    default_args_dict.__doc__ = original.__doc__
    argument_parser.default_args_dict = default_args_dict
    return True
