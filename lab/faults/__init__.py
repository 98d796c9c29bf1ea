"""The fault layer's pure parts: the fault plan and the SSE fault pipeline.

Nothing here imports mitmproxy or does I/O, so the mitmproxy addon (`addons/mcp_faults.py`),
the scenario loader (`lab.scenario`) and the tests share one definition of every fault.

Modules:
    plan      the fault plan: kinds, rules, windows, targeting, parsing/validation and
              the seed-derived decision function
    pipeline  per-flow SSE re-framing with the event-level faults, the bounded memory of
              recent events/IDs/tokens that crossing and replay faults draw from, and the
              tap records of what was sent and what was forwarded
"""
