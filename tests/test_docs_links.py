"""The docs link to each other: every relative Markdown link in README.md and docs/*.md
points at a file that exists (and, for a Markdown file, at a heading or anchor it has),
and a reference to another doc is a link, never a path in backticks or bare text a
reader has to copy."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(
    r"(?<!!)\[(?P<text>(?:[^\]\[]|\[[^\]]*\])*)\]\((?P<target><[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\)"
)
"""An inline Markdown link `[text](target)` (images excluded: `![...](...)`)."""
CODE = re.compile(r"(`+)(.+?)\1")
"""An inline code span."""
DOC_REF = re.compile(r"(?<![\w/.\-])docs/[a-z][a-z-]*\.md(?:#[\w-]+)?(?![\w\-])")
"""A reference to a doc by its path from the repository's root."""
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fence = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax and markup dropped, lower case, every
    character but letters, digits, `-`, `_` and spaces removed, spaces made `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in `path`: its headings' (GitHub numbers repeats
    `-1`, `-2`, ...) and explicit `<a id="...">`."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(path):
        out.update(ANCHOR.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    return [(n, m.group("target").strip("<>")) for n, line in prose_lines(path) for m in LINK.finditer(line)]


def unlinked_doc_refs(path: Path) -> list[tuple[int, str]]:
    """`docs/x.md` in backticks, or bare in the text, outside a link and fenced code. A
    code span holding more than the path (a command line) is code, not a reference."""
    found: list[tuple[int, str]] = []
    for n, line in prose_lines(path):
        rest = LINK.sub(" ", line)
        for m in CODE.finditer(rest):
            if DOC_REF.fullmatch(m.group(2).strip()):
                found.append((n, m.group(0)))
        for m in DOC_REF.finditer(CODE.sub(" ", rest)):
            found.append((n, m.group(0)))
    return found


def test_the_helpers_see_what_github_sees(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Checking a run: `lab report`\n## report.json — `mcpLabReport.v2`\n## Verdicts\n## Verdicts\n"
        '- <a id="glossary-tap"></a>**tap**\n'
        "See `docs/faults.md`, docs/ledgers.md and [docs/spec.md](spec.md); `lab diagram --write docs/x.md`.\n"
        "```sh\ncat docs/report.md\n```\n",
        encoding="utf-8",
    )
    assert anchors(page) == {
        "checking-a-run-lab-report",
        "reportjson--mcplabreportv2",
        "verdicts",
        "verdicts-1",
        "glossary-tap",
    }
    assert links(page) == [(6, "spec.md")]
    assert unlinked_doc_refs(page) == [(6, "`docs/faults.md`"), (6, "docs/ledgers.md")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file_and_anchor_that_exist(page: Path) -> None:
    broken = []
    for n, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http:, https:, mailto: ...: not this repository's
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{page.name}:{n}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}:{n}: {target}: {dest.name} has no heading or anchor '{anchor}'")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_reference_to_another_doc_is_a_link(page: Path) -> None:
    found = unlinked_doc_refs(page)
    assert not found, "write these as Markdown links:\n" + "\n".join(
        f"{page.name}:{n}: {t}" for n, t in found
    )
