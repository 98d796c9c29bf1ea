"""What happened, reconstructed from the wire and the ledgers: streams and their homes, sessions, deliveries, recoveries, reconnects, liveness, faults."""
