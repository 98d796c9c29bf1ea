"""Every part's stderr without secrets: `scrub_stderr()` wraps the process's `sys.stderr` so
that what anyone prints there (its log handlers, gevent's hub printing a crashed
greenlet with the request it carried, a library's traceback) goes through
`lab.wire.redact.scrub`. Kept out of lab.wire, which imports no I/O library (`logging`,
imported only when the wrapper is installed, brings threading)."""

from __future__ import annotations

import io
import sys
from typing import TextIO

from lab.wire.redact import scrub


class ScrubbingStream(io.TextIOBase):
    """A text stream that writes `scrub`bed lines to another (whole lines: a header split
    over two writes is still caught; a partial line waits for its end or a flush)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self._partial = ""

    def write(self, s: str) -> int:
        text = self._partial + s
        end = text.rfind("\n") + 1
        self._partial = text[end:]
        if end:
            self.inner.write(scrub(text[:end]))
        if len(self._partial) > 65536:  # a line without end: never held without bound
            self.flush()
        return len(s)

    def flush(self) -> None:
        if self._partial:
            self.inner.write(scrub(self._partial))
            self._partial = ""
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def isatty(self) -> bool:
        return self.inner.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")


def scrub_stderr() -> None:
    """From now on, everything this process prints to `sys.stderr` (its log handlers, gevent's
    hub printing an exception with the request it was about, a library's traceback) is
    scrubbed of secrets. Idempotent."""
    import logging  # here, not above: the module stays light for the addons (it brings threading)

    if isinstance(sys.stderr, ScrubbingStream) or sys.stderr is None:
        return
    old, new = sys.stderr, ScrubbingStream(sys.stderr)
    sys.stderr = new
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is old:
            handler.setStream(new)
