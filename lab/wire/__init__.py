"""The wire vocabulary every part of the lab shares: SSE codec, event-ID codec, JSON-RPC
messages, protocol revisions and header names, the lab's own extension names,
pseudonyms for secrets, the client ledger's record types, and the error types.

The client core (`lab.client`), the reference server, the fault layer and the checker
all import from here; nothing here imports from any of them (a test enforces it), and
nothing here does I/O.

Modules:
    sse            incremental SSE decoder and encoder
    event_ids      event-ID codec (e1: session tag, generation, stream, sequence, digest, MAC)
    jsonrpc        JSON-RPC messages
    revisions      the protocol revisions, their transport rules, header names
    extensions     names the lab adds (x-lab-conn, idempotency key, event-ID capability)
    redact         HMAC pseudonyms for session IDs and tokens
    client_ledger  record types of the client ledger (mcpClientLedger.v1)
    errors         ProtocolError and who is to blame
"""
