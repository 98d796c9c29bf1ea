"""`lab replay`: a new run that meets a finished run's clients, operations and fault
triggers again, and says whether the same rules fail with the same culprit.

- `recorded`: what a run folder says it did (the scenario file, its client, each client's
  operations from the client ledger or, for a client under test, the proxy tap, every
  fault firing by its trigger);
- `build`: the replay's scenario: scripted clients (`[[load.clients]]`) and faults pinned
  to their triggers (`at`), with toxics kept on their time windows (the fallback);
- `compare`: the two runs side by side (failing rules and culprits, triggers met again);
- `cli`: the command.
"""
