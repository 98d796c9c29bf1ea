"""Reading a run folder: ledgers into frames, their schemas, and inputs given in memory."""
