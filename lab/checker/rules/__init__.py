"""The rules (gates and checks), one module each, and `REGISTRY`, the one list of them.

A new rule is a module here that declares `RULE = Rule(...)` (lab.checker.rules.base:
its stable ID, display number, title, whom it can blame, the evidence it needs, its
budget key, which clients it judges), and one line below. The judge, the report, JUnit,
`lab run --client`'s baseline check and `lab selftest` all read `REGISTRY`.

    1  cross_stream                 events on a stream they do not belong to
    2  duplicate_dispatch           a write performed twice
    3  missing_rehandshake          a 404 not followed by a new handshake
    4  illegal_origin               illegal Origins rejected with 403
    5  resume_p99                   resume latency p99 (liveness: never recovered)
    6  reconnect_qps                reconnects per second, waits against advice
    7  steady_state                 scenarios with `recovery` phases only
    8  rollout                      scenarios that set the server's rollout knobs only
    9  client_resume_cursor         a client under test only (the wire)
    10 client_reconnect_after_gone  a client under test only
    11 client_disconnect_cancel     a client under test only
    12 client_resend                a client under test only
    13 declared_capabilities        runs whose tap saw the initialize declarations
    14 session_routing              a target with replicas behind the proxy, or a URL target
    15 modern_requests              runs of the modern era (2026-07-28) only
    16 capacity                     capacity checks only (`check = "capacity"`)
"""

from lab.checker.rules import (
    capabilities,
    capacity,
    client_after_gone,
    client_cancel,
    client_cursor,
    client_resend,
    cross_stream,
    duplicates,
    modern_requests,
    origin,
    reconnect,
    rehandshake,
    resume,
    rollout,
    routing,
    steady_state,
)
from lab.checker.rules.base import Audience, Registry, Rule, RuleError

REGISTRY = Registry()
for _module in (
    cross_stream,
    duplicates,
    rehandshake,
    origin,
    resume,
    reconnect,
    steady_state,
    rollout,
    client_cursor,
    client_after_gone,
    client_cancel,
    client_resend,
    capabilities,
    routing,
    modern_requests,
    capacity,
):
    REGISTRY.register(_module.RULE)

__all__ = ["REGISTRY", "Audience", "Registry", "Rule", "RuleError"]
