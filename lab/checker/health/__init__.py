"""The lab's own limits: its processes, its hops' latency, requests left unanswered on its hops."""
