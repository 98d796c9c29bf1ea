"""lab: a network fault-injection and load lab for MCP Streamable HTTP session resumption.

This package imports nothing heavy at import time: Locust monkey-patches the process
with gevent on import, and trio code must never share a process with it, so every
subpackage is imported explicitly by whoever needs it.
"""

__version__ = "0.1.0"
