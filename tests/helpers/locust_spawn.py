"""What a Locust worker's spawn message costs in argument-parser builds, without and with
lab.load.locust_spawn's cache.

    python -m tests.helpers.locust_spawn

Run in a process of its own: importing Locust monkey-patches the whole process for
gevent. Prints one JSON line: the options a master sends, the parser builds one spawn
message made without the cache and three made with it, whether the options kept were the
same, whether Locust's worker still calls `default_args_dict()` while receiving one, and
whether a caller's change to its dict reached the next caller.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from locust import argument_parser, runners

from lab.load.locust_spawn import cache_default_args

builds = [0]
_build = argument_parser.get_empty_argument_parser


def _counted(*a: Any, **kw: Any) -> Any:
    builds[0] += 1
    return _build(*a, **kw)


def receive_spawn(parsed_options: dict[str, Any]) -> dict[str, Any]:
    """What `WorkerRunner.handle_message` does with a spawn message's options (Locust 2.x):
    one `default_args_dict()` per option, in the comprehension's condition."""
    return {
        k: v
        for k, v in parsed_options.items()
        if k not in argument_parser.default_args_dict() or k in ["expect_workers", "tags", "exclude_tags"]
    }


def main() -> None:
    argument_parser.get_empty_argument_parser = _counted
    options = {**argument_parser.default_args_dict(), "lab_custom": 1}
    builds[0] = 0
    kept_before = receive_spawn(options)
    without = builds[0]
    applied = cache_default_args() and cache_default_args()
    builds[0] = 0
    kept_after = [receive_spawn(options) for _ in range(3)]
    with_cache = builds[0]
    first = argument_parser.default_args_dict()
    first["host"], first["lab_custom"] = "changed", 2
    second = argument_parser.default_args_dict()
    print(
        json.dumps(
            {
                "options": len(options),
                "builds_without_cache": without,
                "builds_with_cache_3_messages": with_cache,
                "applied": applied,
                "kept": sorted(kept_before),
                "same_kept": all(k == kept_before for k in kept_after),
                "locust_calls_it_per_message": "default_args_dict()"
                in inspect.getsource(runners.WorkerRunner.handle_message),
                "change_leaked": second.get("host") == "changed" or "lab_custom" in second,
            }
        )
    )


if __name__ == "__main__":
    main()
