"""What pyproject.toml cannot say: the data folders shipped as packages.

`scenarios/` and `addons/` stay at the top of the repository; in every install they are
the data packages `lab_scenarios` and `lab_addons`, found by `lab.resources` through the
import system (editable or not). The code packages are found as usual, so a new
subpackage of `lab` ships without a line here.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {"lab_scenarios": "scenarios", "lab_addons": "addons"}
DATA_SUBPACKAGES = ["lab.sut.typescript"]  # the Node adapter: files, no Python

# Which files of them ship: pyproject.toml's [tool.setuptools.package-data].
setup(
    packages=[
        *find_packages(include=["lab", "lab.*", "dashboards", "dashboards.*"]),
        *DATA_SUBPACKAGES,
        *DATA_PACKAGES,
    ],
    package_dir=DATA_PACKAGES,
)
