"""Every lab process's CPU and memory over a run, once a second: `processes.jsonl`.

A lab that saturates one of its own processes measures itself, not the target: a knee or
a failed latency gate found while a Locust worker or mitmdump runs flat out is the lab's
limit. So `lab run` samples every process it started (and everything those started:
each part runs in a session of its own, so its descendants share the part's session ID)
plus itself, from Linux's /proc, and the checker reads the samples
(`lab.checker.health.processes`).

One JSON object per line (schema `mcpLabProcesses.v1`, docs/ledgers.md):

    {"type": "monitor", "t", "schema", "interval_s", "cpus", "clk_tck", "page_size"}     first line
    {"type": "sample", "t", "part", "pid", "cpu", "rss", "fds", "fd_limit", "threads"}  one per process per tick
    {"type": "host", "t", "cpu", "cpus", "load1"}                                       the whole machine, per tick

`cpu` is the cores the process used over the interval since its previous sample (since
it started, for its first sample): 0.93 = 93 % of one core; `rss` bytes; `fds` open file
descriptors, `fd_limit` its soft limit on them (RLIMIT_NOFILE: a process at its limit
cannot accept or open a connection) and `threads` its threads (null when /proc does not
say; `fd_limit` null too when unlimited; files written before it was added lack it).
`part` is the name the process has in run.json (`server`, `mitmproxy`, `nemesis`,
`master`, `worker-<n>`, ...); a descendant of a part is `<part>/<its command name>`; `lab
run` itself is `lab-run`. The `host` record is the whole machine: the cores busy over the
interval (every program on it, the run's and anyone else's: a box shared with other work
slows every part of the run) and the 1-minute load average. Lines are written whole and
flushed every tick, so an interrupted run keeps every sample taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

SCHEMA = "mcpLabProcesses.v1"
FILE = "processes.jsonl"
SELF_PART = "lab-run"
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What /proc says of one process at one moment."""

    pid: int
    comm: str
    session: int
    cpu_ticks: int
    """utime + stime, in clock ticks."""
    start_ticks: int
    """When it started, in clock ticks after boot."""
    threads: int | None


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """/proc/<pid>/stat, or None if the process is gone (or the file cannot be read)."""
    try:
        # A plain open, not Path.read_text: the sampler reads every process's stat once
        # a second (it looks for the parts' children), and pathlib's overhead was most
        # of that.
        with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return parse_stat(pid, text)


def parse_stat(pid: int, text: str) -> ProcStat | None:
    """The fields of a /proc/<pid>/stat line (proc(5)); the command name may hold spaces
    and parentheses, so the fields are counted from its last ')'."""
    open_, close = text.find("("), text.rfind(")")
    if open_ < 0 or close < open_:
        return None
    fields = text[close + 2 :].split()
    # fields[0] is field 3 (state): field n is fields[n - 3].
    try:
        return ProcStat(
            pid=pid,
            comm=text[open_ + 1 : close],
            session=int(fields[3]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            start_ticks=int(fields[19]),
            threads=int(fields[17]),
        )
    except (IndexError, ValueError):
        return None


def _rss(pid: int, page_size: int, proc: Path) -> int | None:
    try:
        return int((proc / str(pid) / "statm").read_text().split()[1]) * page_size
    except (OSError, IndexError, ValueError):
        return None


def _fds(pid: int, proc: Path) -> int | None:
    try:
        return len(os.listdir(proc / str(pid) / "fd"))
    except OSError:
        return None


def read_fd_limit(pid: int, proc: Path = PROC) -> int | None:
    """The soft limit on open files of a process (/proc/<pid>/limits, "Max open files"):
    None if unlimited, gone or unreadable."""
    try:
        text = (proc / str(pid) / "limits").read_text()
    except OSError:
        return None
    return parse_fd_limit(text)


def parse_fd_limit(text: str) -> int | None:
    """The soft "Max open files" of a /proc/<pid>/limits text (proc(5): a header line,
    then one limit per line, the name in the first 26 columns)."""
    for line in text.splitlines():
        if line.startswith("Max open files"):
            fields = line[len("Max open files") :].split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


FD_LIMIT_RECHECK = 0.8
"""A process's limit is read once; again only when its open fds reach this share of the
limit read: a process that raised its own limit after it was first read (Locust does at
start) is then not taken for one about to run out."""


def _uptime_ticks(clk_tck: int, proc: Path) -> float | None:
    try:
        return float((proc / "uptime").read_text().split()[0]) * clk_tck
    except (OSError, IndexError, ValueError):
        return None


class Sampler:
    """One pass over the processes of a run: `sample(parts)` gives the sample records.

    `parts` are (part name, PID) of the processes the run started; each one's
    descendants (its session) are found by scanning /proc. CPU is the tick difference
    since this sampler last saw the PID (since the process started, the first time).
    """

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self.clk_tck = os.sysconf("SC_CLK_TCK")
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self._last: dict[tuple[int, int], tuple[float, int]] = {}
        """(pid, start ticks) -> (time, cpu ticks) of its previous sample."""
        self._host: tuple[float, int, int] | None = None
        """(time, busy ticks, total ticks) of the machine at the previous sample."""
        self._fd_limits: dict[tuple[int, int], int | None] = {}
        """(pid, start ticks) -> its soft RLIMIT_NOFILE, read once (see FD_LIMIT_RECHECK)."""

    def header(self, now: float, interval: float) -> dict[str, Any]:
        return {
            "type": "monitor",
            "t": now,
            "schema": SCHEMA,
            "interval_s": interval,
            "cpus": os.cpu_count(),
            "clk_tck": self.clk_tck,
            "page_size": self.page_size,
        }

    def sample(self, parts: Iterable[tuple[str, int]], now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        named = [(name, pid, read_stat(pid, self.proc)) for name, pid in parts]
        sessions = {st.pid: name for name, _, st in named if st is not None and st.session == st.pid}
        seen = {pid for _, pid, st in named if st is not None}
        found = [(name, st) for name, _, st in named if st is not None]
        if sessions:
            found += [
                (f"{sessions[st.session]}/{st.comm}", st)
                for st in self._scan()
                if st.session in sessions and st.pid not in seen
            ]
        uptime = _uptime_ticks(self.clk_tck, self.proc)
        out = []
        alive: set[tuple[int, int]] = set()
        for name, st in found:
            key = (st.pid, st.start_ticks)
            alive.add(key)
            previous = self._last.get(key)
            if previous is not None and now > previous[0]:
                cpu = (st.cpu_ticks - previous[1]) / self.clk_tck / (now - previous[0])
            elif uptime is not None and uptime > st.start_ticks:
                cpu = st.cpu_ticks / (uptime - st.start_ticks)  # its average since it started
            else:
                cpu = 0.0
            self._last[key] = (now, st.cpu_ticks)
            fds = _fds(st.pid, self.proc)
            out.append(
                {
                    "type": "sample",
                    "t": round(now, 3),
                    "part": name,
                    "pid": st.pid,
                    "cpu": round(max(cpu, 0.0), 3),
                    "rss": _rss(st.pid, self.page_size, self.proc),
                    "fds": fds,
                    "fd_limit": self._fd_limit(key, fds),
                    "threads": st.threads,
                }
            )
        self._last = {k: v for k, v in self._last.items() if k in alive}
        self._fd_limits = {k: v for k, v in self._fd_limits.items() if k in alive}
        return out

    def _fd_limit(self, key: tuple[int, int], fds: int | None) -> int | None:
        """The process's soft RLIMIT_NOFILE: read the first time it is seen, and again
        while its open fds are near the limit last read (FD_LIMIT_RECHECK)."""
        known = key in self._fd_limits
        limit = self._fd_limits.get(key)
        if not known or (limit is not None and fds is not None and fds >= FD_LIMIT_RECHECK * limit):
            limit = self._fd_limits[key] = read_fd_limit(key[0], self.proc)
        return limit

    def host(self, now: float | None = None) -> dict[str, Any] | None:
        """The machine's busy cores since the previous call (None the first time, or if
        /proc/stat cannot be read): every program's, not only the run's."""
        now = time.time() if now is None else now
        try:
            fields = (self.proc / "stat").read_text().splitlines()[0].split()
            ticks = [int(x) for x in fields[1:]]
        except (OSError, IndexError, ValueError):
            return None
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        total = sum(ticks[:8])  # guest time is already counted in user
        previous, self._host = self._host, (now, total - idle, total)
        if previous is None or total <= previous[2]:
            return None
        cpus = os.cpu_count() or 1
        busy = (total - idle - previous[1]) / (total - previous[2]) * cpus
        try:
            load1: float | None = float((self.proc / "loadavg").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            load1 = None
        return {
            "type": "host",
            "t": round(now, 3),
            "cpu": round(max(busy, 0.0), 3),
            "cpus": cpus,
            "load1": load1,
        }

    def _scan(self) -> list[ProcStat]:
        out: list[ProcStat] = []
        try:
            names = os.listdir(self.proc)
        except OSError:
            return out
        for name in names:
            if name.isdigit():
                st = read_stat(int(name), self.proc)
                if st is not None:
                    out.append(st)
        return out


class ProcessMonitor:
    """A thread that appends samples of `parts()` to `path` every `interval` seconds
    until `stop()` (which takes one last sample). A failure to write stops the sampling,
    never the run: the report then says the samples end early."""

    def __init__(
        self, path: Path, parts: Callable[[], Iterable[tuple[str, int]]], interval: float = 1.0
    ) -> None:
        self.path = path
        self.parts = parts
        self.interval = interval
        self.sampler = Sampler()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-process-monitor", daemon=True)
        self._out: IO[str] | None = None

    def start(self) -> None:
        try:
            self._out = self.path.open("a", encoding="utf-8")
            self._write([self.sampler.header(time.time(), self.interval)])
            self.sampler.host()  # the machine's first reading: its busy cores count from here
        except OSError as e:
            self.error = f"cannot write {self.path}: {e.strerror or e}"
            return
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=10)
        if self._out is not None:
            with contextlib.suppress(OSError):
                self._out.close()
            self._out = None

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval)
            try:
                now = time.time()
                records = self.sampler.sample([(SELF_PART, os.getpid()), *self.parts()], now)
                host = self.sampler.host(now)
                self._write(records if host is None else [*records, host])
            except OSError as e:
                self.error = f"cannot write {self.path}: {e.strerror or e}"
                return
            if stopping:
                return

    def _write(self, records: list[dict[str, Any]]) -> None:
        assert self._out is not None
        self._out.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        self._out.flush()
