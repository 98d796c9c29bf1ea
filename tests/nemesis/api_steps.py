"""The Toxiproxy API steps whose answers were recorded from a real `toxiproxy-server`
(tests/nemesis/fixtures/toxiproxy-api/) and replayed against the embedded nemesis in
compat mode (test_recorded_answers.py). Run in this order on a server with no proxies:
each step may depend on the state the previous ones left.

In paths and bodies, `{up}` stands for the port of a live upstream (a TCP echo server on
127.0.0.1) and `{api_port}` for the API's own port (a listen address that is taken).
`differs` marks a step whose answer the embedded nemesis deliberately does not copy even
in compat mode, with the reason (docs/nemesis.md lists them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class ApiStep:
    id: str
    method: str
    path: str
    body: str | None = None
    differs: str | None = None


UP: Final = '"upstream": "127.0.0.1:{up}"'
LISTEN: Final = '"listen": "127.0.0.1:0"'


def _toxic(kind: str, attributes: str, extra: str = "") -> str:
    return f'{{"type": "{kind}", "attributes": {attributes}{extra}}}'


STEPS: Final[tuple[ApiStep, ...]] = (
    ApiStep("version", "GET", "/version"),
    ApiStep("proxies-empty", "GET", "/proxies"),
    # -- proxies: create ------------------------------------------------------------------
    ApiStep("create-p1", "POST", "/proxies", f'{{"name": "p1", {UP}, {LISTEN}}}'),
    ApiStep("create-p1-again", "POST", "/proxies", f'{{"name": "p1", {UP}, {LISTEN}}}'),
    ApiStep("create-no-name", "POST", "/proxies", f"{{{UP}}}"),
    ApiStep("create-empty-name", "POST", "/proxies", f'{{"name": "", {UP}}}'),
    ApiStep("create-no-upstream", "POST", "/proxies", '{"name": "p9"}'),
    ApiStep("create-not-json", "POST", "/proxies", "not json"),
    ApiStep("create-empty-body", "POST", "/proxies", ""),
    ApiStep("create-array", "POST", "/proxies", "[]"),
    ApiStep("create-enabled-string", "POST", "/proxies", f'{{"name": "p9", {UP}, "enabled": "yes"}}'),
    ApiStep("create-p2-disabled", "POST", "/proxies", f'{{"name": "p2", {UP}, {LISTEN}, "enabled": false}}'),
    ApiStep(
        "create-p3-unknown-field", "POST", "/proxies", f'{{"name": "p3", {UP}, {LISTEN}, "colour": "red"}}'
    ),
    ApiStep(
        "create-listen-taken",
        "POST",
        "/proxies",
        f'{{"name": "p9", {UP}, "listen": "127.0.0.1:{{api_port}}"}}',
    ),
    ApiStep("proxies-three", "GET", "/proxies"),
    ApiStep("show-p1", "GET", "/proxies/p1"),
    ApiStep("show-missing", "GET", "/proxies/nope"),
    # -- toxics: create, one of each kind ---------------------------------------------------
    ApiStep("add-latency", "POST", "/proxies/p1/toxics", _toxic("latency", '{"latency": 100, "jitter": 10}')),
    ApiStep("add-latency-again", "POST", "/proxies/p1/toxics", _toxic("latency", '{"latency": 100}')),
    ApiStep("add-bandwidth", "POST", "/proxies/p1/toxics", _toxic("bandwidth", '{"rate": 100}')),
    ApiStep("add-slow-close", "POST", "/proxies/p1/toxics", _toxic("slow_close", '{"delay": 10}')),
    ApiStep("add-timeout", "POST", "/proxies/p1/toxics", _toxic("timeout", '{"timeout": 10}')),
    ApiStep("add-reset-peer", "POST", "/proxies/p1/toxics", _toxic("reset_peer", '{"timeout": 10}')),
    ApiStep("add-limit-data", "POST", "/proxies/p1/toxics", _toxic("limit_data", '{"bytes": 1000}')),
    ApiStep(
        "add-slicer",
        "POST",
        "/proxies/p1/toxics",
        _toxic("slicer", '{"average_size": 10, "size_variation": 2, "delay": 5}'),
    ),
    ApiStep(
        "add-named-upstream",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", '{"latency": 5}', ', "name": "lat_up", "stream": "upstream", "toxicity": 0.5'),
    ),
    ApiStep(
        "add-stream-capitals",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", "{}", ', "name": "caps", "stream": "UPSTREAM"'),
    ),
    ApiStep("add-defaults", "POST", "/proxies/p3/toxics", '{"type": "latency"}'),
    ApiStep(
        "add-empty-name", "POST", "/proxies/p3/toxics", _toxic("bandwidth", '{"rate": 5}', ', "name": ""')
    ),
    # what a real Toxiproxy accepts and the strict nemesis refuses
    ApiStep(
        "add-negative", "POST", "/proxies/p1/toxics", _toxic("latency", '{"latency": -5}', ', "name": "neg"')
    ),
    ApiStep(
        "add-toxicity-2",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", "{}", ', "name": "tox2", "toxicity": 2'),
    ),
    ApiStep(
        "add-toxicity-negative",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", "{}", ', "name": "toxneg", "toxicity": -0.5'),
    ),
    ApiStep(
        "add-unknown-attribute",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", '{"latency": 1, "bogus": 3}', ', "name": "unk_attr"'),
    ),
    ApiStep(
        "add-unknown-field",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", "{}", ', "name": "unk_field", "colour": "red"'),
    ),
    ApiStep(
        "add-rate-0", "POST", "/proxies/p2/toxics", _toxic("bandwidth", '{"rate": 0}', ', "name": "rate0"')
    ),
    ApiStep(
        "add-slicer-0",
        "POST",
        "/proxies/p2/toxics",
        _toxic("slicer", '{"average_size": 0}', ', "name": "slicer0"'),
    ),
    ApiStep(
        "add-slicer-variation",
        "POST",
        "/proxies/p2/toxics",
        _toxic("slicer", '{"average_size": 4, "size_variation": 9}', ', "name": "slicer_var"'),
    ),
    ApiStep("add-no-attributes", "POST", "/proxies/p2/toxics", '{"type": "timeout", "name": "bare"}'),
    # refused by both
    ApiStep("add-unknown-type", "POST", "/proxies/p1/toxics", _toxic("gremlins", "{}")),
    ApiStep("add-no-type", "POST", "/proxies/p1/toxics", '{"attributes": {}}'),
    ApiStep(
        "add-bad-stream",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", "{}", ', "name": "x", "stream": "sideways"'),
    ),
    ApiStep(
        "add-float", "POST", "/proxies/p1/toxics", _toxic("latency", '{"latency": 1.5}', ', "name": "x"')
    ),
    ApiStep(
        "add-string-attr",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", '{"latency": "5"}', ', "name": "x"'),
    ),
    ApiStep(
        "add-bool-attr", "POST", "/proxies/p1/toxics", _toxic("latency", '{"latency": true}', ', "name": "x"')
    ),
    ApiStep(
        "add-toxicity-string",
        "POST",
        "/proxies/p1/toxics",
        _toxic("latency", "{}", ', "name": "x", "toxicity": "1"'),
    ),
    ApiStep("add-attributes-array", "POST", "/proxies/p1/toxics", _toxic("latency", "[]", ', "name": "x"')),
    ApiStep("add-not-json", "POST", "/proxies/p1/toxics", "nope"),
    ApiStep("add-empty-body", "POST", "/proxies/p1/toxics", ""),
    ApiStep("add-array", "POST", "/proxies/p1/toxics", "[]"),
    ApiStep("add-missing-proxy", "POST", "/proxies/nope/toxics", _toxic("latency", "{}")),
    ApiStep("toxics-p1", "GET", "/proxies/p1/toxics"),
    ApiStep("toxics-p2", "GET", "/proxies/p2/toxics"),
    ApiStep("toxics-missing-proxy", "GET", "/proxies/nope/toxics"),
    ApiStep("show-toxic", "GET", "/proxies/p1/toxics/latency_downstream"),
    ApiStep("show-toxic-missing", "GET", "/proxies/p1/toxics/nope"),
    ApiStep("show-p1-with-toxics", "GET", "/proxies/p1"),
    # -- toxics: update ---------------------------------------------------------------------
    ApiStep(
        "update-attribute", "POST", "/proxies/p1/toxics/latency_downstream", '{"attributes": {"jitter": 2}}'
    ),
    ApiStep("update-toxicity-patch", "PATCH", "/proxies/p1/toxics/latency_downstream", '{"toxicity": 0.5}'),
    ApiStep("update-name", "POST", "/proxies/p1/toxics/latency_downstream", '{"name": "renamed"}'),
    ApiStep("update-type", "POST", "/proxies/p1/toxics/latency_downstream", '{"type": "bandwidth"}'),
    ApiStep("update-stream", "POST", "/proxies/p1/toxics/latency_downstream", '{"stream": "upstream"}'),
    ApiStep(
        "update-negative", "POST", "/proxies/p1/toxics/latency_downstream", '{"attributes": {"latency": -1}}'
    ),
    ApiStep("update-toxicity-3", "POST", "/proxies/p1/toxics/latency_downstream", '{"toxicity": 3}'),
    ApiStep("update-unknown-field", "POST", "/proxies/p1/toxics/latency_downstream", '{"colour": "red"}'),
    ApiStep(
        "update-unknown-attribute",
        "POST",
        "/proxies/p1/toxics/latency_downstream",
        '{"attributes": {"bogus": 1}}',
    ),
    ApiStep(
        "update-rate-0", "POST", "/proxies/p1/toxics/bandwidth_downstream", '{"attributes": {"rate": 0}}'
    ),
    ApiStep(
        "update-string-attr",
        "POST",
        "/proxies/p1/toxics/latency_downstream",
        '{"attributes": {"latency": "x"}}',
    ),
    ApiStep("update-not-json", "POST", "/proxies/p1/toxics/latency_downstream", "nope"),
    ApiStep("update-missing-toxic", "POST", "/proxies/p1/toxics/nope", '{"toxicity": 1}'),
    ApiStep("update-missing-proxy", "POST", "/proxies/nope/toxics/x", '{"toxicity": 1}'),
    ApiStep("show-toxic-after-updates", "GET", "/proxies/p1/toxics/latency_downstream"),
    # -- proxies: update --------------------------------------------------------------------
    ApiStep("disable-p1", "POST", "/proxies/p1", '{"enabled": false}'),
    ApiStep("enable-p1-patch", "PATCH", "/proxies/p1", '{"enabled": true}'),
    ApiStep("move-p1", "POST", "/proxies/p1", f"{{{LISTEN}}}"),
    ApiStep("same-upstream-p1", "POST", "/proxies/p1", f"{{{UP}}}"),
    ApiStep("rename-p1", "POST", "/proxies/p1", '{"name": "other"}'),
    ApiStep("update-p1-unknown-field", "POST", "/proxies/p1", '{"colour": "red"}'),
    ApiStep("update-p1-not-json", "POST", "/proxies/p1", "xx"),
    ApiStep("update-p1-enabled-string", "POST", "/proxies/p1", '{"enabled": "no"}'),
    ApiStep("update-missing-proxy-body", "POST", "/proxies/nope", "{}"),
    ApiStep("proxies-after-updates", "GET", "/proxies"),
    # -- removals ---------------------------------------------------------------------------
    ApiStep("remove-bandwidth", "DELETE", "/proxies/p1/toxics/bandwidth_downstream"),
    ApiStep("remove-bandwidth-again", "DELETE", "/proxies/p1/toxics/bandwidth_downstream"),
    ApiStep("remove-on-missing-proxy", "DELETE", "/proxies/nope/toxics/x"),
    ApiStep("delete-p3", "DELETE", "/proxies/p3"),
    ApiStep("delete-p3-again", "DELETE", "/proxies/p3"),
    ApiStep("reset", "POST", "/reset"),
    ApiStep("proxies-after-reset", "GET", "/proxies"),
    # -- populate ---------------------------------------------------------------------------
    ApiStep("populate-one", "POST", "/populate", f'[{{"name": "pop1", {UP}, {LISTEN}}}]'),
    ApiStep("populate-same", "POST", "/populate", f'[{{"name": "pop1", {UP}, {LISTEN}}}]'),
    ApiStep("populate-empty", "POST", "/populate", "[]"),
    ApiStep("populate-object", "POST", "/populate", '{"name": "x"}'),
    ApiStep("populate-missing-upstream", "POST", "/populate", '[{"name": "pop2"}]'),
    ApiStep("populate-not-json", "POST", "/populate", "nope"),
    # -- other paths and methods ------------------------------------------------------------
    ApiStep("unknown-path", "GET", "/nope"),
    ApiStep("too-deep", "GET", "/proxies/p1/toxics/x/more"),
    ApiStep("put-proxies", "PUT", "/proxies"),
    ApiStep("delete-version", "DELETE", "/version"),
    ApiStep("get-reset", "GET", "/reset"),
    ApiStep("delete-p1", "DELETE", "/proxies/p1"),
    ApiStep("delete-p2", "DELETE", "/proxies/p2"),
    ApiStep("delete-pop1", "DELETE", "/proxies/pop1"),
    ApiStep("proxies-at-the-end", "GET", "/proxies"),
)


def fill(text: str, *, up: int, api_port: int) -> str:
    """A step's path or body with the placeholders filled in."""
    return text.replace("{up}", str(up)).replace("{api_port}", str(api_port))


_ADDRESS = re.compile(r"^(127\.0\.0\.1|localhost|\[::\]|\[::1\]|):(\d+)$")


def normalise(value: object, *, up: int) -> object:
    """An answer with what differs from run to run replaced: bound ports become `<port>`,
    the upstream's port `<up>`, the version `<version>`."""
    if isinstance(value, dict):
        return {k: ("<version>" if k == "version" else normalise(v, up=up)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, up=up) for v in value]
    if isinstance(value, str):
        match = _ADDRESS.match(value)
        if match:
            port = "<up>" if match.group(2) == str(up) else "<port>"
            return f"{match.group(1)}:{port}"
    return value
