"""The timed sections of a scenario (`[[faults]]`, `[[toxics]]`), its `[budgets]`, and the
checks across sections; called by `lab.scenario.read`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from lab.faults.checks import Fields, Issue, describe
from lab.faults.decisions import Window
from lab.faults.kinds import Need
from lab.faults.plan import Rule, contradictions, read_rule
from lab.nemesis.toxics import BREAKS_CONNECTIONS, KIND_ATTRIBUTES, parse_attributes
from lab.scenario.parts import (
    FAULT_FREE_PHASES,
    REQUIRED_ATTRIBUTES,
    RESTART_HOWS,
    TOXIC_STREAMS,
    Budgets,
    Load,
    Phase,
    Reconnect,
    Restart,
    TargetSpec,
    Toxic,
)
from lab.wire import budgets


def read_faults(
    tables: list[Fields], phases: Mapping[str, Phase], horizon: float, issues: list[Issue]
) -> tuple[list[Rule], list[str]]:
    rules: list[Rule] = []
    keys: list[str] = []
    for i, f in enumerate(tables):
        window = phase_window(f, phases, "window")
        rule = read_rule(f, i, window=window, extra_keys=("phase",))
        if rule is None:
            continue
        w = rule.window
        if w is not None and w.start >= horizon:
            f.problem("window", f"never active: it starts at {w.start:g}s and the run lasts {horizon:g}s")
        rules.append(rule)
        keys.append(f.prefix)
    issues.extend(contradictions(rules, keys))
    return rules, keys


def phase_window(f: Fields, phases: Mapping[str, Phase], other: str) -> Window | None:
    """The window of a `phase = "name"` binding (None if there is none)."""
    if not f.has("phase"):
        return None
    name = f.get("phase")
    if f.has(other) or (other == "at" and f.has("until")):
        f.problem("phase", f"give either phase or {other}, not both")
    if not isinstance(name, str) or name not in phases:
        known = ", ".join(phases) or "none: this scenario has no [[phases]]"
        f.problem("phase", f"unknown phase {describe(name)} (phases: {known})")
        return None
    p = phases[name]
    return Window(p.start, p.end)


def read_toxics(
    tables: list[Fields], phases: Mapping[str, Phase], horizon: float, issues: list[Issue]
) -> tuple[list[Toxic], list[str]]:
    toxics: list[Toxic] = []
    keys: list[str] = []
    names: dict[str, str] = {}
    for i, f in enumerate(tables):
        if not f.has("kind"):
            f.problem("kind", f"required: one of {', '.join(KIND_ATTRIBUTES)}")
        kind = f.choice("kind", "", KIND_ATTRIBUTES)
        name = f.string(
            "name", f"{kind or 'toxic'}-{i}", pattern=re.compile(r"[A-Za-z0-9_.-]{1,64}"), what="a toxic name"
        )
        if name in names:
            f.problem("name", f"duplicate toxic name {name!r} (also {names[name]})")
        names.setdefault(name, f.prefix)
        stream = f.choice("stream", "downstream", TOXIC_STREAMS)
        toxicity = f.number("toxicity", 1.0, lo=0.0, hi=1.0, what="a number in 0..1 (probability)")
        if toxicity == 0:
            f.problem("toxicity", "0 is not allowed: a toxic with toxicity 0 still fires; remove it instead")
        window = phase_window(f, phases, "at")
        if window is not None:
            at, until = window.start, window.end
        else:
            at = f.duration("at", 0.0)
            until = f.optional_duration("until")
            if until is not None and until <= at:
                f.problem("until", f"must be after at ({until:g}s <= {at:g}s)")
                until = None
        if at >= horizon:
            f.problem("at", f"never active: it starts at {at:g}s and the run lasts {horizon:g}s")
        attributes = toxic_attributes(f.table("attributes"), kind)
        f.done()
        if kind:
            toxics.append(Toxic(name, kind, stream, toxicity, attributes, at, until))
            keys.append(f.prefix)
    for j, t in enumerate(toxics):
        for k in range(j):
            o = toxics[k]
            if (
                o.kind == t.kind
                and o.stream == t.stream
                and Window(o.at, o.until).overlaps(Window(t.at, t.until))
            ):
                issues.append(
                    Issue(
                        f"{keys[j]}.at",
                        f"overlaps {keys[k]} ({o.name!r}): two {t.kind} toxics on the {t.stream} at once "
                        "contradict each other; make their times disjoint",
                    )
                )
    return toxics, keys


RESTART_GAP_S = 3.0
"""Seconds a restarted reference server is given to come back (it is ready in about one)
before the next restart may begin."""


def read_restarts(
    tables: list[Fields], target: TargetSpec, horizon: float, issues: list[Issue]
) -> list[Restart]:
    """`[[restarts]]`: each `at` inside the run, in order, each begun after the previous
    one is back up; `how` and `down` are the reference server's (a URL target's restart is
    its `target.restart_command`)."""
    out: list[Restart] = []
    for f in tables:
        if not f.has("at"):
            f.problem("at", "required: when the target restarts, seconds after the run start (like '30s')")
        at = f.duration("at", 0.0)
        d = Restart(at)
        how = f.choice("how", d.how, RESTART_HOWS)
        down = f.duration("down", d.down)
        if target.replicas > 1:
            f.problem("at", "restarts of replicas are not supported yet: give target.replicas = 1")
        if target.kind != "reference":
            for key in ("how", "down"):
                if f.has(key):
                    f.problem(
                        key,
                        "only for target.kind = 'reference' (a URL target restarts by its restart_command)",
                    )
        f.done()
        if f.has("at") and at >= horizon:
            f.problem("at", f"never happens: the run lasts {horizon:g}s")
            continue
        if out and at < out[-1].at + out[-1].down + RESTART_GAP_S:
            prev = out[-1]
            f.problem(
                "at",
                f"must be at least {prev.down + RESTART_GAP_S:g}s after the previous restart's at ({prev.at:g}s): "
                "the server is down, then starting, until then (restarts in time order)",
            )
            continue
        out.append(Restart(at, how, down))
    return out


def toxic_attributes(f: Fields, kind: str) -> dict[str, int]:
    names = KIND_ATTRIBUTES.get(kind)
    if names is None:
        return {}
    out: dict[str, int] = {}
    for attr in names:
        if attr in REQUIRED_ATTRIBUTES.get(kind, ()) and not f.has(attr):
            f.problem(attr, f"required for a {kind} toxic: an integer >= 0")
        out[attr] = f.integer(attr, 0, lo=0)
    f.done()
    try:
        return dict(parse_attributes(kind, out))
    except ValueError as e:  # the nemesis's rules across attributes (e.g. slicer sizes)
        f.problem("", str(e))
        return out


def read_budgets(
    f: Fields, load: Load, reconnect: Reconnect, faults: list[Rule], toxics: list[Toxic]
) -> Budgets:
    kinds = [r.spec for r in faults if r.rate > 0]
    breaks_streams = any(k.breaks_streams for k in kinds) or any(t.kind in BREAKS_CONNECTIONS for t in toxics)
    b = Budgets(
        reconnect_qps=f.number("reconnect_qps", reconnect.budget_qps, lo=0.0, lo_open=True),
        resume_p99_s=f.duration("resume_p99_s", budgets.RESUME_P99_S, positive=True),
        cross_stream_max=f.integer("cross_stream_max", budgets.CROSS_STREAM_MAX, lo=0),
        duplicate_dispatch_max=f.integer("duplicate_dispatch_max", budgets.DUPLICATE_DISPATCH_MAX, lo=0),
        missing_rehandshake_max=f.integer("missing_rehandshake_max", budgets.MISSING_REHANDSHAKE_MAX, lo=0),
        origin_reject_rate=f.rate("origin_reject_rate", budgets.ORIGIN_REJECT_RATE),
        min_events=f.integer("min_events", load.event_target or 0, lo=0),
        min_recoveries=f.integer("min_recoveries", 1 if breaks_streams else 0, lo=0),
        # Gate 3 needs 404s, gate 4 illegal Origins: a kind that makes them asks for the evidence.
        min_404=f.integer("min_404", 1 if any(3 in k.feeds for k in kinds) else 0, lo=0),
        min_illegal_origin=f.integer(
            "min_illegal_origin", 1 if any(4 in k.feeds for k in kinds) else 0, lo=0
        ),
        recovery_events_ratio=f.rate("recovery_events_ratio", 0.9),
        recovery_resume_p99_factor=f.number("recovery_resume_p99_factor", 1.5, lo=1.0),
        recovery_resume_p99_slack_s=f.duration("recovery_resume_p99_slack_s", 0.25),
        recovery_error_rate_slack=f.rate("recovery_error_rate_slack", 0.01),
        min_baseline_events=f.integer("min_baseline_events", 100, lo=0),
        call_error_rate_max=f.rate("call_error_rate_max", 0.01),
        min_rollout_sessions=f.integer("min_rollout_sessions", 10, lo=0),
        unanswered_max_share=f.rate("unanswered_max_share", 0.01),
        answer_p99_s=f.duration("answer_p99_s", 2.0, positive=True),
    )
    f.done()
    return b


def cross_checks(
    target: TargetSpec,
    faults: list[Rule],
    keys: list[str],
    toxics: list[Toxic],
    toxic_keys: list[str],
    phases: list[Phase],
    issues: list[Issue],
) -> None:
    """Checks across sections: what the target offers, and faults in fault-free phases."""
    knobs_refused = (
        "phase knobs need the reference server's admin control (target.kind = 'reference')"
        if target.kind != "reference"
        else "phase knobs are set on one server: not with target.replicas > 1"
        if target.replicas > 1
        else None
    )
    if knobs_refused is not None:
        issues.extend(Issue(f"phases[{i}].server", knobs_refused) for i, p in enumerate(phases) if p.server)
    for rule, key in zip(faults, keys, strict=True):
        if target.era == "handshake" and rule.spec.only_modern is not None:
            issues.append(
                Issue(
                    f"{key}.kind",
                    f"{rule.kind} has no meaning in the handshake era ({rule.spec.only_modern}), and the "
                    'scenario asks for era = "handshake" (docs/eras.md): set era = "modern" or "both"',
                )
            )
        if target.era == "modern" and rule.spec.not_modern is not None:
            issues.append(
                Issue(
                    f"{key}.kind",
                    f"{rule.kind} has no meaning in the modern era ({rule.spec.not_modern}), and the "
                    'scenario asks for era = "modern" (docs/eras.md): remove it, or test both eras (era = "both")',
                )
            )
        needs = rule.spec.needs
        if Need.ADMIN_CONTROL in needs and target.kind != "reference":
            issues.append(
                Issue(
                    f"{key}.kind",
                    f"{rule.kind} needs the reference server's admin control (target.kind = 'reference'); "
                    "kill_session ends sessions on any server",
                )
            )
        if Need.TWO_TOKENS in needs and target.kind == "reference" and len(target.tokens) < 2:
            issues.append(
                Issue(
                    f"{key}.kind",
                    f"{rule.kind} needs target.tokens with at least two subjects (else every token is the same)",
                )
            )
    quiet = [p for p in phases if p.kind in FAULT_FREE_PHASES]
    for rule, key in zip(faults, keys, strict=True):
        w = rule.window or Window()
        for p in quiet:
            if w.overlaps(Window(p.start, p.end)):
                issues.append(
                    Issue(
                        f"{key}.window",
                        f"active during the {p.kind} phase {p.name!r} ({p.start:g}s..{p.end:g}s), which allows "
                        "no faults; bind it to a faults phase (phase = ...) or move its window",
                    )
                )
    for t, tkey in zip(toxics, toxic_keys, strict=True):
        for p in quiet:
            if Window(t.at, t.until).overlaps(Window(p.start, p.end)):
                issues.append(
                    Issue(
                        f"{tkey}.at",
                        f"active during the {p.kind} phase {p.name!r} ({p.start:g}s..{p.end:g}s), which allows no faults",
                    )
                )
