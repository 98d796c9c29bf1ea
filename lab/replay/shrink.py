"""`lab shrink`: from a failing run to the smallest scenario that still fails the same way.

The method is delta debugging (Zeller and Hildebrandt's ddmin) over what a replay is made
of (lab.replay.build): the fault firings pinned to their triggers, the scripted clients,
and each client's operations. A candidate is a smaller replay; the **oracle** runs it with
`lab run`, k of n times at most (2 of 3 by default, two at once), and accepts it only if
it fails the same rule with the same culprit in k of them: a failure that comes and goes
with timing is not taken for a smaller one. It starts from the clients the rule's
witnesses name (sessions mapped to their clients by the client ledger, or by the proxy
tap for a client under test), falling back to
every client when those alone do not fail; then removes firings (all of them first, then
halves, then smaller chunks; tried first: the firings on the request nearest before the
first witness), then clients, then each client's operations. It stops when
nothing more can go or when its time budget is spent, with the best candidate so far.

Removing operations renumbers the pins of the requests that follow: a pin on the 3rd
`POST tools/call ticker` of a client whose 1st ticker call was removed becomes a pin on
its 2nd (other kinds of requests are left as they are; the oracle has the last word).

Every candidate runs the run's own client (`Recorded.client`: a client under test
included), as its scenario's `[load] client` and `lab run --client` both say.

Pure apart from `Oracle` (processes) and `witness_clients` (the ledger file, the tap).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lab.faults.pins import client_of
from lab.load.settings import TOOL_OF_OP, ClientScript
from lab.replay.build import is_toxic, scenario_for
from lab.replay.compare import culprit, refired
from lab.replay.recorded import Recorded, read_json_object, read_triggers, tap_flows

SESSION = re.compile(r"s_[0-9a-f]{20}")


@dataclass(frozen=True)
class Candidate:
    scripts: tuple[ClientScript, ...]
    triggers: tuple[dict[str, Any], ...]

    @property
    def ops(self) -> int:
        return sum(len(s.ops) for s in self.scripts)

    def size(self) -> str:
        return f"{len(self.scripts)} client(s), {len(self.triggers)} trigger(s), {self.ops} operation(s)"

    def with_clients(self, scripts: Sequence[ClientScript]) -> Candidate:
        kept = {s.id for s in scripts}
        return Candidate(
            tuple(scripts),
            tuple(t for t in self.triggers if t.get("client") in kept or t.get("client") is None),
        )


def triggers_of(rec: Recorded, clients: set[str]) -> tuple[dict[str, Any], ...]:
    """The firings a replay of `clients` can pin (and the toxics, by time)."""
    return tuple(
        t for t in rec.triggers
        if (t.get("client") in clients and t.get("by") != "time") or is_toxic(t)
    )  # fmt: skip


def witness_clients(rec: Recorded, rule: str) -> list[list[str]]:
    """The clients each of a rule's witnesses names, in the report's order: by a connection
    (`<client>:<n>`) or a client ID in its text, or by a session the client ledger says
    was theirs."""
    witnesses = _witnesses(rec, rule)
    ids = [s.id for s in rec.scripts]
    owner = _session_owners(rec) if SESSION.search(json.dumps(witnesses)) else {}
    out = []
    for w in witnesses:
        text = json.dumps(w)
        named = {c for c in ids if re.search(rf"(?<![\w.-]){re.escape(c)}(?=[:\"\s,)])", text)}
        named |= {owner[s] for s in SESSION.findall(text) if s in owner}
        out.append([c for c in ids if c in named])
    return [c for c in out if c]


def _witnesses(rec: Recorded, rule: str) -> list[Any]:
    """The rule's witnesses in the run's report.json, in its order."""
    return ((rec.report or {}).get("rules") or {}).get(rule, {}).get("witnesses") or []


CONN = re.compile(r"(?<![\w.-])([A-Za-z0-9_.-]+):(\d+)(?!\d)")
SINCE = re.compile(r"T\+(\d+(?:\.\d+)?) s")


def nearest_requests(
    rec: Recorded, rule: str, triggers: Sequence[dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """`triggers` grouped by the request they hit, nearest to the rule's first witness first:
    a fault that breaks a rule most often fired on the witness's client just before (the
    write whose answer was lost, the session killed before the request answered 400).
    Nearest before its highest connection number of a client; else nearest to any time it
    names (`T+x s`, the run's zero as the triggers' `at_s`), the earlier on a tie."""
    witnesses = _witnesses(rec, rule)
    if not witnesses:
        return []
    text = json.dumps(witnesses[0])
    ids = {s.id for s in rec.scripts}
    conns = [(c, int(n)) for c, n in CONN.findall(text) if c in ids]
    requests: dict[str, list[dict[str, Any]]] = {}
    if conns:
        client = conns[0][0]
        last = max(n for c, n in conns if c == client)
        near = [t for t in triggers if t.get("client") == client and (_conn_number(t) or 0) <= last]
        near.sort(key=lambda t: -(_conn_number(t) or 0))
    else:
        times = [float(x) for x in SINCE.findall(text)]
        if not times:
            return []
        near = [t for t in triggers if t.get("at_s") is not None]
        near.sort(key=lambda t: (min(abs(float(t["at_s"]) - x) for x in times), float(t["at_s"])))
    for t in near:
        requests.setdefault(str(t.get("conn")), []).append(t)
    return list(requests.values())


def _conn_number(t: dict[str, Any]) -> int | None:
    _, sep, n = str(t.get("conn") or "").rpartition(":")
    return int(n) if sep and n.isdigit() else None


def _session_owners(rec: Recorded) -> dict[str, str]:
    """Session pseudonym -> the client that held it (the client ledger's `sessions`; for a
    client under test, which keeps no ledger, the tap: the client whose `initialize` was
    given it)."""
    owners: dict[str, str] = {}
    for _, flow in tap_flows(rec.run_dir, b'"session_out"'):
        client = client_of(str(flow.get("conn") or ""))
        if client and flow.get("session_out"):
            owners.setdefault(str(flow["session_out"]), client)
    for path in sorted((rec.run_dir / "clients").glob("*.sqlite")):
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                owners.update(
                    (str(s), str(c))
                    for s, c in db.execute("SELECT DISTINCT session, client_id FROM sessions")
                )
            finally:
                db.close()
        except sqlite3.Error:
            continue
    return owners


def without_ops(cand: Candidate, client: str, keep: Sequence[int]) -> Candidate:
    """`cand` with only the operations `keep` (indexes) of `client`; pins of its tool calls
    renumbered, pins on a removed call dropped."""
    script = next(s for s in cand.scripts if s.id == client)
    kept = set(keep)
    removed_before: dict[str, list[int]] = {}  # tool -> ordinals (1-based among its calls) removed
    seen: dict[str, int] = {}
    for i, op in enumerate(script.ops):
        tool = TOOL_OF_OP.get(op, op)
        seen[tool] = seen.get(tool, 0) + 1
        if i not in kept:
            removed_before.setdefault(tool, []).append(seen[tool])
    new_script = ClientScript(
        client,
        tuple(o for i, o in enumerate(script.ops) if i in kept),
        tuple(a for i, a in enumerate(script.at) if i in kept),
    )
    triggers = []
    for t in cand.triggers:
        request = str(t.get("request") or "")
        if t.get("client") == client and request.startswith("POST tools/call "):
            gone = removed_before.get(request.removeprefix("POST tools/call "), [])
            ordinal = int(t.get("ordinal") or 0)
            if ordinal in gone:
                continue
            t = {**t, "ordinal": ordinal - sum(1 for g in gone if g < ordinal)}
        triggers.append(t)
    scripts = tuple(new_script if s.id == client else s for s in cand.scripts)
    return Candidate(scripts, tuple(triggers))


# ---------------------------------------------------------------------------- ddmin


def ddmin[T](items: Sequence[T], still_fails: Callable[[Sequence[T]], bool], *, least: int = 0) -> list[T]:
    """The smallest sublist (keeping order) for which `still_fails` holds, by removing
    chunks: first everything (down to `least` items: the first ones), then halves, then
    ever smaller chunks (ddmin's complements). `still_fails(items)` is assumed."""
    current = list(items)
    if len(current) <= least:
        return current
    if still_fails(current[:least]):
        return current[:least]
    n = 2
    while len(current) > least and len(current) >= 2:
        size = max(1, len(current) // n)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        for i in range(len(chunks)):
            rest = [x for j, c in enumerate(chunks) if j != i for x in c]
            if len(rest) >= least and still_fails(rest):
                current = rest
                n = max(n - 1, 2)
                break
        else:
            if size == 1:
                break
            n = min(len(current), 2 * n)
    return current


# ---------------------------------------------------------------------------- the oracle


@dataclass
class Trial:
    number: int
    size: str
    outcomes: list[str] = field(default_factory=list)
    """Each run's `verdict/culprit` of the rule (or what went wrong)."""
    accepted: bool = False
    seconds: float = 0.0
    events: list[int] = field(default_factory=list)
    """Each run's event count (report.json `event_count`), of the runs that had one."""
    pinned: int = 0
    """The candidate's firings (pinned, and toxics by time)."""
    fired_again: list[int] = field(default_factory=list)
    """Each run's count of those it met again (lab.replay.compare.refired): a candidate
    that fails to reproduce because its pins were not met says so."""


class OutOfTime(Exception):
    """The budget is spent: the shrink stops with the best so far."""


class Oracle:
    """Runs a candidate with `lab run` until k runs fail the rule with its culprit (accept)
    or n - k + 1 do not (refuse); two at a time."""

    def __init__(
        self,
        rec: Recorded,
        rule: str,
        culprit_: str | None,
        *,
        target: str,
        folder: Path,
        k: int,
        n: int,
        deadline: float,
        lab: str,
        say: Callable[[str], None],
        client: str = "lab",
    ) -> None:
        self.rec, self.rule, self.culprit = rec, rule, culprit_
        self.target, self.folder, self.k, self.n = target, folder, k, n
        self.deadline, self.lab, self.say = deadline, lab, say
        self.client = client
        """`lab run --client` of every run: the original run's client."""
        self.trials: list[Trial] = []
        self.runs = 0
        self.smallest: Candidate | None = None
        """The last candidate accepted: the smallest so far (each accepted one is smaller)."""

    def __call__(self, cand: Candidate) -> bool:
        if time.monotonic() >= self.deadline:
            raise OutOfTime
        trial = Trial(len(self.trials) + 1, cand.size(), pinned=len(cand.triggers))
        self.trials.append(trial)
        began = time.monotonic()
        path = self.folder / "candidates" / f"c{trial.number:03d}.toml"
        self.write(cand, path)
        fails = passes = 0
        while fails < self.k and passes < self.n - self.k + 1:
            batch = min(2, self.k - fails, self.n - fails - passes) or 1
            for code, folder in self._run(path, trial.number, batch):
                outcome, events = self._outcome(folder, code)
                trial.outcomes.append(outcome)
                if events is not None:
                    trial.events.append(events)
                # How many of the candidate's firings the run met again.
                trial.fired_again.append(refired(cand.triggers, read_triggers(folder)) if folder else 0)
                if outcome == f"fail/{self.culprit}":
                    fails += 1
                else:
                    passes += 1
        trial.accepted = fails >= self.k
        if trial.accepted:
            self.smallest = cand
        trial.seconds = round(time.monotonic() - began, 1)
        met = ", ".join(f"{n} of {trial.pinned}" for n in trial.fired_again)
        self.say(
            f"candidate {trial.number}: {trial.size}: {', '.join(trial.outcomes)} "
            f"(firings met again: {met}) -> {'smaller, kept' if trial.accepted else 'refused'} "
            f"({trial.seconds:.0f} s)"
        )
        return trial.accepted

    def write(self, cand: Candidate, path: Path) -> None:
        from lab.runfolder import replace_file
        from lab.scenario.write import scenario_toml

        doc, _ = scenario_for(self.rec, cand.scripts, cand.triggers)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, scenario_toml(doc))

    def _run(self, scenario: Path, number: int, count: int) -> list[tuple[int | None, Path | None]]:
        """`count` runs of `scenario` at once: each one's exit code and run folder (None
        if it wrote no report)."""
        procs = []
        for _ in range(count):
            self.runs += 1
            out = self.folder / "runs" / f"c{number:03d}-{self.runs:03d}"
            out.mkdir(parents=True, exist_ok=True)
            argv = [
                self.lab,
                "run",
                str(scenario),
                "--target",
                self.target,
                "--client",
                self.client,
                "--out",
                str(out),
                "--quiet",
                "--no-figures",
            ]
            log = (out / "lab-run.log").open("wb")
            procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), out, log))
        outcomes = []
        for proc, out, log in procs:
            try:
                proc.wait(timeout=max(60.0, self.deadline - time.monotonic() + 120.0))
            except subprocess.TimeoutExpired:
                proc.kill()  # by PID (Popen), never by name
                proc.wait()
            log.close()
            folders = sorted(p for p in out.iterdir() if (p / "report.json").is_file())
            outcomes.append((proc.returncode, folders[-1] if folders else None))
        return outcomes

    def _outcome(self, folder: Path | None, code: int | None) -> tuple[str, int | None]:
        """The run's `verdict/culprit` of the rule, and its event count."""
        if folder is None:
            return f"no report (exit {code})", None
        report = read_json_object(folder / "report.json")
        if report is None:
            return f"unreadable report (exit {code})", None
        events = report.get("event_count")
        count = events if isinstance(events, int) else None
        rule = (report.get("rules") or {}).get(self.rule)
        if not isinstance(rule, dict):
            return "rule not judged", count
        return f"{rule.get('verdict')}/{culprit(rule)}", count


# ---------------------------------------------------------------------------- the whole shrink


@dataclass
class Shrunk:
    rule: str
    culprit: str | None
    original: Candidate
    start: Candidate
    best: Candidate | None
    """None: not even the start reproduced the failure."""
    stopped: str
    """`done` (nothing more could go) or `budget`."""


def shrink(rec: Recorded, rule: str, oracle: Oracle, say: Callable[[str], None]) -> Shrunk:
    rule_data = ((rec.report or {}).get("rules") or {})[rule]
    every = Candidate(rec.scripts, triggers_of(rec, {s.id for s in rec.scripts}))
    result = Shrunk(rule, culprit(rule_data), every, every, None, "done")
    say(f"shrinking {rec.run_id} for rule {rule} (culprit {result.culprit}): from {every.size()}")
    starts = _starts(rec, rule, every, say)
    try:
        for start in starts:
            result.start = start
            if oracle(start):
                result.best = start
                break
            if start is not starts[-1]:
                say("not reproduced from there: starting from more clients")
        if result.best is None:
            return result
        best = result.best
        best = _nearest_first(rec, rule, best, oracle)
        kept = ddmin(best.triggers, lambda ts: oracle(replace(best, triggers=tuple(ts))))
        best = replace(best, triggers=tuple(kept))
        kept_scripts = ddmin(best.scripts, lambda ss: oracle(best.with_clients(ss)), least=1)
        best = best.with_clients(kept_scripts)
        for script in best.scripts:
            indexes = ddmin(list(range(len(script.ops))), _ops_oracle(oracle, best, script.id))
            best = without_ops(best, script.id, indexes)
        result.best = best
    except OutOfTime:
        result.stopped = "budget"
        result.best = oracle.smallest or result.best
    return result


def _starts(rec: Recorded, rule: str, every: Candidate, say: Callable[[str], None]) -> list[Candidate]:
    """Where to start, smallest first: the clients of the rule's first witness, then of all
    its witnesses, then every client (each with all their firings)."""
    named = witness_clients(rec, rule)
    every_named = sorted({c for w in named for c in w})
    groups: list[list[str]] = []
    for group in (named[0] if named else [], every_named):
        if group and group not in groups and len(group) < len(rec.scripts):
            groups.append(group)
    if named:
        say(f"its witnesses name {', '.join(every_named)}; the first one {', '.join(named[0])}")
    return [
        *(Candidate(tuple(s for s in rec.scripts if s.id in g), triggers_of(rec, set(g))) for g in groups),
        every,
    ]


def _nearest_first(rec: Recorded, rule: str, best: Candidate, oracle: Oracle) -> Candidate:
    """Before delta debugging the firings: the ones on the request nearest before the
    witness, then on the two nearest (`nearest_requests`); the smallest that fails."""
    groups = nearest_requests(rec, rule, best.triggers)
    for n in (1, 2):
        if len(groups) < n:
            break
        chosen = {id(t) for g in groups[:n] for t in g}
        smaller = tuple(t for t in best.triggers if id(t) in chosen)
        if len(smaller) < len(best.triggers) and oracle(replace(best, triggers=smaller)):
            return replace(best, triggers=smaller)
    return best


def _ops_oracle(oracle: Oracle, base: Candidate, client: str) -> Callable[[Sequence[int]], bool]:
    """Whether `base` with only these operations of `client` still fails."""
    return lambda keep: oracle(without_ops(base, client, keep))
