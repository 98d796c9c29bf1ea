"""The embedded nemesis in compat mode answers the recorded API steps as a real Toxiproxy
2.12.0 did (tests/nemesis/fixtures/toxiproxy-api/): same status, same JSON, error texts
aside. The default, strict mode still refuses what it refuses on purpose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nemesis.api_steps import STEPS
from tests.nemesis.record_toxiproxy_answers import replay, running_embedded
from tests.nemesis.upstreams import TcpServer, echo

pytestmark = pytest.mark.live

FIXTURE = Path(__file__).parent / "fixtures" / "toxiproxy-api" / "answers.json"

STRICT_REFUSALS = {
    "create-p3-unknown-field": "unknown proxy field",
    "add-negative": "must be >= 0",
    "add-toxicity-2": "toxicity must be in 0..1",
    "add-toxicity-negative": "toxicity must be in 0..1",
    "add-unknown-attribute": "unknown attribute",
    "add-unknown-field": "unknown toxic field",
    "add-rate-0": "bandwidth.rate must be >= 1",
    "add-slicer-0": "slicer.average_size must be >= 1",
    "add-slicer-variation": "must be smaller than",
    "update-name": "name cannot change",
    "update-type": "type cannot change",
    "update-stream": "stream cannot change",
    "update-negative": "must be >= 0",
    "update-toxicity-3": "toxicity must be in 0..1",
    "update-unknown-field": "unknown toxic field",
    "update-unknown-attribute": "unknown attribute",
    "update-rate-0": "bandwidth.rate must be >= 1",
    "rename-p1": "name cannot change",
    "update-p1-unknown-field": "unknown proxy field",
}
"""Steps a real Toxiproxy accepts (2xx) and the strict nemesis refuses (400), with the
words of the refusal."""


def comparable(answer: dict[str, object]) -> dict[str, object]:
    """What must be equal: status, plain text, and JSON with error texts blanked (they
    differ on purpose) and `stream` in lower case (Toxiproxy echoes the case it was sent)."""

    def clean(value: object) -> object:
        if isinstance(value, dict):
            return {
                k: "<error>" if k == "error" else str(v).lower() if k == "stream" else clean(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return {"status": answer["status"], "text": answer.get("text"), "json": clean(answer.get("json"))}


def differences(expected: list[dict[str, object]], got: list[dict[str, object]]) -> list[str]:
    out = []
    for want, have in zip(expected, got, strict=True):
        if comparable(want) != comparable(have):
            out.append(f"{want['id']}: real {comparable(want)}\n    embedded {comparable(have)}")
    return out


@pytest.fixture(scope="module")
def recorded() -> list[dict[str, object]]:
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert document["server"] == "toxiproxy-server 2.12.0"
    steps: list[dict[str, object]] = document["steps"]
    assert [s["id"] for s in steps] == [s.id for s in STEPS], "the fixture matches the step list"
    return steps


def _replayed(compat: bool, tmp_path: Path) -> list[dict[str, object]]:
    with TcpServer(echo) as up, running_embedded(compat, tmp_path) as url:
        return replay(url, up.port)


def test_compat_mode_answers_as_the_real_server(recorded: list[dict[str, object]], tmp_path: Path) -> None:
    found = differences(recorded, _replayed(True, tmp_path))
    assert not found, "\n".join(found)


def test_strict_mode_refuses_what_the_real_server_takes(
    recorded: list[dict[str, object]], tmp_path: Path
) -> None:
    strict = {a["id"]: a for a in _replayed(False, tmp_path)}
    real = {a["id"]: a for a in recorded}
    for step, words in STRICT_REFUSALS.items():
        assert 200 <= int(str(real[step]["status"])) < 300, (step, real[step])
        answer = strict[step]
        assert answer["status"] == 400, (step, answer)
        error = answer["json"]
        assert isinstance(error, dict) and words in str(error["error"]), (step, error)
    # and the comparison sees it: strict answers are not taken for the real server's
    assert len(differences(recorded, list(strict.values()))) >= len(STRICT_REFUSALS)
