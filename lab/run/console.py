"""`lab run` and the person who started it: its lines on stdout and stderr (`Console`),
and the signals that stop it (`Interrupts`)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class Console:
    """Lines on stdout (progress; none with `quiet`) and stderr (problems). A closed stream
    (the terminal went away) is muted from then on: it does not stop the run."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self._mute_out = self._mute_err = False

    def say(self, text: str, *, err: bool = False) -> None:
        """Print a line; a closed stdout or stderr (the terminal went away) does not stop the run."""
        if (self.quiet and not err) or (err and self._mute_err) or (not err and self._mute_out):
            return
        try:
            print(text, file=sys.stderr if err else sys.stdout, flush=True)
        except OSError:  # BrokenPipeError, EIO of a hung-up terminal
            if err:
                self._mute_err = True
            else:
                self._mute_out = True


class Interrupts:
    """SIGINT, SIGTERM or SIGHUP once: `interrupted`, every part is stopped and what was
    written is kept; a second time: `force`, every part is stopped at once (SIGKILL)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, say: Callable[..., None]) -> None:
        self.interrupted = threading.Event()
        self.force = threading.Event()
        self._say = say
        self._old: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        """These signals come here from now on, until `restore`."""
        self._old = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}

    def restore(self) -> None:
        """The handlers from before `install`."""
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.interrupted.is_set():
            if not self.force.is_set():
                self.force.set()
                self._say(f"\n{name} again: stopping every part at once (SIGKILL)", err=True)
            return
        self.interrupted.set()
        self._say(
            f"\n{name}: stopping every part, keeping what was written (again to force)",
            err=True,
        )
