"""The sans-IO core of the lab's MCP client: no sockets, no clocks, no threads.

Bytes and facts go in (with the time as a parameter), events and commands come out.
Nothing here imports gevent, trio, httpx or locust, so the same core runs under a
Locust worker (gevent) and a trio driver, and is tested without any I/O.

Modules:
    sse          incremental SSE decoder and encoder
    event_ids    event-ID codec (e1: session tag, generation, stream, sequence, digest, MAC)
    jsonrpc      JSON-RPC messages
    revisions    the protocol revisions and their transport rules
    states       the state table (every transition, in one file)
    acceptance   accept_stream_event: the only door into the client
    reconnect    retry/Retry-After, backoff with jitter, the reconnect budget
    client       ClientCore: the client as a state machine driven by its I/O driver
    commands     commands to the driver and notices to the application
    records      client ledger rows
    redact       HMAC pseudonyms for session IDs and tokens
"""
