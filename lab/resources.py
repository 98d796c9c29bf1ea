"""Where the lab's data files are, in a source checkout, an editable install and a wheel alike.

The scenarios (`scenarios/*.toml`) and the mitmproxy addons (`addons/*.py`) stay at the
top of the repository, where people look for them; packaging ships them as the data
packages `lab_scenarios` and `lab_addons` (`setup.py` maps the folders to those names),
so the import system finds them wherever `lab` was installed. Nothing here guesses a
path from `__file__`: a wheel installed into site-packages has no repository around it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Final

SCENARIOS_PACKAGE: Final = "lab_scenarios"
ADDONS_PACKAGE: Final = "lab_addons"


class MissingDataError(RuntimeError):
    """A data package is not installed: the installation is broken."""


def package_dir(package: str) -> Path:
    """The folder holding the data package `package`, as a filesystem path.

    The package's import spec names its folder: in a wheel, `site-packages/<package>`; in
    an editable install, the source folder (mapped by setuptools' finder). That is what
    `importlib.resources.files` reads too, but it is not used here: for the editable
    install's namespace package it fails on Python 3.12 (a placeholder entry of the search
    path is not a directory), and it imports `zipfile` (threads) into the scenario loader,
    which must stay light.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise MissingDataError(
            f"the data package {package!r} is not installed: reinstall lab (`pip install .` or `make venv`)"
        )
    for location in spec.submodule_search_locations or []:
        if Path(location).is_dir():
            return Path(location)
    raise MissingDataError(f"the data package {package!r} has no folder on disk (a zipped install?)")


def scenario_dir() -> Path:
    """The folder of the named scenarios (`lab run smoke` reads `<this>/smoke.toml`)."""
    return package_dir(SCENARIOS_PACKAGE)


def addon_dir() -> Path:
    """The folder of the mitmproxy addons (`mitmdump -s <this>/mcp_faults.py`)."""
    return package_dir(ADDONS_PACKAGE)
