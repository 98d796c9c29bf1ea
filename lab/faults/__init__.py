"""The fault layer's pure parts: fault kinds as plug-ins, the plan, and the tap's SSE pipe.

Nothing here imports mitmproxy or does I/O, so the mitmproxy addons (`addons/mcp_faults.py`,
`addons/mcp_tap.py`), the scenario loader (`lab.scenario`), the checker's fault accounting
and the tests share one definition of every fault.

Modules:
    kinds      the registry of fault kinds: one small plug-in per kind (params schema,
               unit, applies, hooks, evidence), grouped by family
    plan       the fault plan: rules, windows, targeting, parsing/validation
    decisions  seed-derived decisions (same seed, same traffic: same decisions)
    flows      the faults of one flow, hook by hook (what the addon asks)
    events     the event faults of one SSE flow
    pipeline   the tap's SSE pipe: sent, forwarded/dropped, with the event faults between
    memory     the bounded memory of recent events, IDs and tokens faults draw from
    results    write receipts seen on the wire (the tap's `result` records)
    records    the tap's flow-level records
    facts      what a request says; checks: typed reads that name every problem
    docs       docs/faults.md's generated sections (`python -m lab.faults.docs --check`)
    balance    the proxy as a load balancer: which replica gets a request
    launch     the mitmdump command line
"""
