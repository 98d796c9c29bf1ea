"""A lab process raises its open-files soft limit to the hard one (and its children inherit it).

Run in a child process started with a soft limit of 256, the way many systems start
programs: the limit of this test process is left alone.
"""

from __future__ import annotations

import resource
import subprocess
import sys

CHILD = """
import resource
from lab.oslimits import raise_open_files_limit
before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
soft, hard = raise_open_files_limit()
import subprocess, sys
child = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(before, soft, hard, child)
"""


def _low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_the_soft_limit_is_raised_to_the_hard_one_and_inherited() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, preexec_fn=_low_soft_limit
    ).stdout.split()
    before, soft, child_soft = int(out[0]), int(out[1]), int(out[3])
    assert before == 256
    expected = hard if hard != resource.RLIM_INFINITY else 1_048_576
    assert soft == expected > 256
    assert child_soft == soft
