"""`lab run`: the orchestrator of a whole run (processes, progress, run.json, the report)."""
