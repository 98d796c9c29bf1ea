"""A non-editable install works from any folder: `pip install .` (a wheel, built offline
from a copy of the sources) into a fresh venv, then, from an empty folder, `lab scenarios`
lists the scenarios shipped as package data, and a short `lab run` finds the addon and the
locustfile in the installed package.

No download: the venv reuses this environment's installed dependencies (a `.pth` line
naming its site-packages, where this project is only an editable finder that a `.pth`
line cannot activate), and their console scripts (`locust`, `mitmdump`) are written into
the venv the way pip would, from their entry points."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers.once import once
from tests.livesrv import ROOT

pytestmark = pytest.mark.live
SOURCES = (
    "lab",
    "addons",
    "scenarios",
    "dashboards",
    "pyproject.toml",
    "setup.py",
    "README.md",
    "constraints.txt",
)


def _script(venv: Path, name: str) -> None:
    (ep,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == name]
    path = venv / "bin" / name
    path.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {ep.module} import {ep.attr}\nsys.exit({ep.attr}())\n"
    )
    path.chmod(0o755)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One install for the module's tests, whichever workers run them (tests.helpers.once).
    _, venv = once(tmp_path_factory, "install", _install)
    return Path(venv)


def _install(base: Path) -> str:
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "reuse-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--verbose",  # the build backend's warnings too (install.log)
        "--no-deps",
        "--no-build-isolation",
    ]
    done = subprocess.run([*pip, str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (venv / "install.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    for name in ("locust", "mitmdump"):
        _script(venv, name)
    shutil.rmtree(src)  # nothing of the sources may be needed any more
    return str(venv)


def test_the_build_says_nothing_about_the_project_and_ships_the_node_adapter(installed: Path) -> None:
    # The project's own packaging warnings (a deprecated license table, the adapter's folder
    # "would be ignored") were most of what a first `make` printed.
    log = (installed / "install.log").read_text(encoding="utf-8")
    for said in ("project.license", "would be ignored", "is absent from the `packages`"):
        assert said not in log, log
    site = Path(sysconfig.get_paths(vars={"base": str(installed), "platbase": str(installed)})["purelib"])
    shipped = {p.name for p in (site / "lab" / "sut" / "typescript").iterdir()}
    assert {"adapter.mjs", "package.json", "package-lock.json"} <= shipped


def test_lab_scenarios_lists_the_packaged_scenarios_from_an_empty_folder(
    installed: Path, tmp_path: Path
) -> None:
    lab = str(installed / "bin" / "lab")
    where = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "import lab, lab.resources as r; print(lab.__file__); print(r.scenario_dir())",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(str(installed) in w for w in where), f"not the installed package: {where}"
    out = subprocess.run([lab, "scenarios"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = dict(line.split(None, 1) for line in out.stdout.splitlines() if not line.startswith(" "))
    assert names["smoke"].startswith("Small end-to-end check") and "gate-100k" in names


def test_a_short_run_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    scenario = tmp_path / "url.toml"
    scenario.write_text((ROOT / "tests" / "run" / "url.toml").read_text())
    out = subprocess.run(
        [str(installed / "bin" / "lab"), "run", str(scenario), "--no-report", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (folder,) = (tmp_path / "results").iterdir()  # ./results of the folder it ran in
    argv = (folder / "run.json").read_text()
    assert str(installed) in argv and "lab_addons/mcp_faults.py" in argv, "the addon came from the package"
