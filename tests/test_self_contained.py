"""The repository stands alone: no file refers to documents outside it (the design notes
the project started from). What a reader needs lives in docs/ (docs/spec.md for the rules
and gates, docs/architecture.md for the data path and the layers)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OUTSIDE = re.compile(r"\.\./shared|" + r"|".join(re.escape(n + ".md") for n in ("SPEC", "DESIGN", "STYLE")))
"""A path into the folder beside the repository, or one of the design notes by name. (Built
from parts so that this file does not match itself.)"""

CI_ENTRY = ".ci/run"
"""The one file that may look beside the repository: for a real toxiproxy-server the
machine has there, which it passes to the tests by `LAB_TOXIPROXY_SERVER` (the tests
themselves never name the folder). Only that line is allowed, nothing else in it."""
CI_ALLOWED = re.compile(r"\.\./shared/bin(/toxiproxy-server)?\b")

_SKIP_DIRS = {".git", ".venv", "results", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def repository_files() -> list[Path]:
    """The files git tracks (or, without git, every file outside build and run folders)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
        return [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not _SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def outside_references(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every reference to a document outside the repository."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def test_the_detector_sees_a_reference_and_passes_a_clean_text() -> None:
    bad = "Gate 5 (see " + "SPEC" + ".md) and ../" + "shared/notes\nfine line\nas " + "DESIGN" + ".md says"
    assert [n for n, _ in outside_references(bad)] == [1, 3]
    assert outside_references("Gate 5 (see docs/spec.md); docs/architecture.md; spec.md; SPEC") == []


def test_no_file_refers_outside_the_repository() -> None:
    found = []
    for path in repository_files():
        if not path.is_file():  # deleted in the work tree, not yet in git
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        refs = outside_references(text)
        if path.relative_to(ROOT).as_posix() == CI_ENTRY:
            refs = [(n, line) for n, line in refs if OUTSIDE.search(CI_ALLOWED.sub("", line))]
        found += [f"{path.relative_to(ROOT)}:{n}: {line}" for n, line in refs]
    assert not found, "references outside the repository (point at docs/ instead):\n" + "\n".join(found)


def test_the_pages_they_point_to_exist() -> None:
    for page in ("docs/spec.md", "docs/architecture.md"):
        assert (ROOT / page).is_file(), page
