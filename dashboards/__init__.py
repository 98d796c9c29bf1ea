"""The lab's dashboards: figures (matplotlib, PNG) and the one-file HTML report.

Everything here reads a results folder only (the ledgers through `lab.checker.load`,
or the report.json the checker wrote): it can be re-run on any past run.

    dashboards.series   time series computed from the ledgers (events/s, clients, ...)
    dashboards.figures  the PNG figures
    dashboards.html     report.html, with the figures embedded as base64
"""
