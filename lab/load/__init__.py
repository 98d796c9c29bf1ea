"""Load: Locust MCP users and the locustfile `lab run` starts (imports Locust: never import
this package's user/locustfile modules from a process that uses trio)."""
