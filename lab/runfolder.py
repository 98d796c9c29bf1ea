"""A run folder's life: created once by one `lab run`, its run.json written whole, and a
folder whose owner died marked *abandoned* by whoever looks at it next.

- `create_run_folder(root, scenario)` makes `<root>/<UTC time to the millisecond>-<scenario>-<random>`
  exclusively (`mkdir` without `exist_ok`): two runs started in one second, in one
  results root, each get their own folder, and no run ever writes into another's.
- `write_run_json(folder, record)` replaces run.json atomically (`replace_file`: a
  temporary file, then `os.replace`); when the disk is full or the folder unwritable it
  removes the temporary file and raises `RunFolderError` (one line, no traceback wanted).
- run.json carries `status` (`running`, `finished`, `abandoned`) and `owner` (the PID and
  process start time of the `lab run` that writes it). `mark_abandoned(folder)` turns a
  `running` run.json whose owner is gone into `abandoned` (`complete: false`), so a run
  killed with `kill -9` is never read as still going or as complete;
  `mark_abandoned_runs(root)` does it for every folder of a results root. `lab run` calls
  it at its start; `lab report` calls `mark_abandoned` on the folder it checks.

Standard library only, so every layer (the checker, the report) may call it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

RUN_FILE: Final = "run.json"
SECRETS_DIR: Final = ".secrets"
"""Private (0700) folder of files a run's parts read secrets from; never kept after the run."""
STATUSES: Final = ("running", "finished", "abandoned")
"""run.json `status`: the checker reads `running` and `abandoned` as a run that did not finish."""


class RunFolderError(RuntimeError):
    """The run folder could not be created or written (disk full, permissions)."""


def create_run_folder(root: Path, scenario: str, *, attempts: int = 20) -> Path:
    """A new folder `<root>/<YYYYmmddTHHMMSS.fffZ>-<scenario>-<4 hex>`, created exclusively."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError(f"cannot create the results folder {root}: {e.strerror or e}") from None
    for _ in range(attempts):
        now = datetime.now(UTC)
        stamp = now.strftime("%Y%m%dT%H%M%S") + f".{now.microsecond // 1000:03d}Z"
        folder = root / f"{stamp}-{scenario}-{secrets.token_hex(2)}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # another run took this name in this very millisecond: draw again
        except OSError as e:
            raise RunFolderError(f"cannot create a run folder in {root}: {e.strerror or e}") from None
        return folder
    raise RunFolderError(f"no free run folder name in {root} after {attempts} attempts")


def secrets_dir(folder: Path) -> Path:
    """`<folder>/.secrets`, created private (0700). Remove it with `drop_secrets`."""
    path = folder / SECRETS_DIR
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_secret(folder: Path, name: str, text: str) -> Path:
    """A 0600 file in the folder's secrets folder, whole or not at all (a process waiting
    for it never reads half of it); its path."""
    path = secrets_dir(folder) / name
    tmp = path.with_name(f"{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def secret_path(folder: Path, name: str) -> Path:
    """Where `write_secret(folder, name, ...)` writes (the secrets folder made if needed)."""
    return secrets_dir(folder) / name


def drop_secrets(folder: Path) -> None:
    """Delete the folder's secrets folder (nothing of it stays in a finished run)."""
    shutil.rmtree(folder / SECRETS_DIR, ignore_errors=True)


def replace_file(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (`<name>.tmp` beside it, then `os.replace`), so
    a reader never sees half a file; when it cannot be written (disk full, permissions) the
    temporary file is removed and RunFolderError says which file and why."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RunFolderError(f"cannot write {path}: {e.strerror or e}") from None


def write_run_json(folder: Path, record: dict[str, Any]) -> None:
    """Replace `<folder>/run.json` atomically; RunFolderError if it cannot be written."""
    replace_file(folder / RUN_FILE, json.dumps(record, indent=2, default=str))


def read_run_json(folder: Path) -> dict[str, Any] | None:
    """run.json as a dict, or None when it is missing or not a JSON object."""
    try:
        record = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def owner() -> dict[str, Any]:
    """run.json `owner`: this process (its PID, and its start time so a reused PID is not it)."""
    return {"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()), "host": os.uname().nodename}


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def owner_alive(record: dict[str, Any]) -> bool:
    """Whether the process recorded as run.json's owner still runs (on this host)."""
    own = record.get("owner")
    if not isinstance(own, dict) or not isinstance(own.get("pid"), int):
        return False
    if own.get("host") not in (None, os.uname().nodename):
        return True  # another machine's run: not ours to judge
    pid: int = own["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    if not Path("/proc").is_dir():
        return True  # no /proc to tell a reused PID from the owner: trust the PID
    ticks = _start_ticks(pid)
    return ticks is not None and own.get("start_ticks") in (None, ticks)


def mark_abandoned(folder: Path) -> bool:
    """If `folder`'s run.json says `running` and its owner is gone, mark it `abandoned`
    (complete false, the reason in end_reason) and drop its secrets. True if it did."""
    record = read_run_json(folder)
    if record is None:
        return False
    # Folders written before `status` existed said `end_reason: running` while running.
    status = record.get("status") or ("running" if record.get("end_reason") == "running" else None)
    if status != "running":
        return False
    if owner_alive(record):
        return False
    pid = (record.get("owner") or {}).get("pid")
    record.update(
        status="abandoned",
        complete=False,
        end_reason=f"abandoned: the lab run that owned this folder (pid {pid}) died without finishing",
        abandoned_at=time.time(),
    )
    drop_secrets(folder)
    write_run_json(folder, record)
    return True


def mark_abandoned_runs(root: Path) -> list[Path]:
    """`mark_abandoned` on every folder of a results root; the folders it marked."""
    if not root.is_dir():
        return []
    marked = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        with contextlib.suppress(RunFolderError):  # an unwritable old folder is not this run's concern
            if mark_abandoned(folder):
                marked.append(folder)
    return marked
