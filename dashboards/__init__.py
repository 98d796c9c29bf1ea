"""The report's presentation, shipped with the package as data: what report.html looks
like and how the figures are styled. No code renders here (that is `lab.report`), so a
designer can change the look without touching the checker or the report's logic.

    report.html.j2      the Jinja2 template of report.html (rendered with autoescaping)
    report.css          its style sheet, inlined into the page
    report.js           its one script: counts the figures the browser decoded
    figures.mplstyle    the matplotlib style of every figure (sizes, colours, fonts)

`asset(name)` reads one of them as text, and `asset_path(name)` gives it as a file for
the time of a `with` block, from a source tree, a wheel or a zip alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import as_file, files
from pathlib import Path

ASSETS = ("report.html.j2", "report.css", "report.js", "figures.mplstyle")


def asset(name: str) -> str:
    """The text of one presentation file (one of `ASSETS`)."""
    _known(name)
    return files(__name__).joinpath(name).read_text(encoding="utf-8")


@contextmanager
def asset_path(name: str) -> Iterator[Path]:
    """One presentation file as a path on disk (matplotlib reads styles from paths)."""
    _known(name)
    with as_file(files(__name__).joinpath(name)) as path:
        yield path


def _known(name: str) -> None:
    if name not in ASSETS:
        raise KeyError(f"dashboards has no asset {name!r} (it has {', '.join(ASSETS)})")
