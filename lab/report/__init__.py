"""The report, above the checker: what `lab report` and `lab run` write from its verdict.

The checker (`lab.checker`) decides; this package only presents. It imports nothing at
package level, so `lab --help` stays instant.

    outputs.py   `report_run(run_dir)`: judge, write every output, print, exit code
    document.py  report.json (mcpLabReport.v2, docs/report.md)
    markdown.py  report.md and the terminal's gate table
    junit.py     junit.xml
    html.py      report.html from the `dashboards` template (Jinja2, autoescaped)
    evidence.py  the raw ledger rows behind witnesses' refs (report.html's appendix)
    figures.py   the PNG figures (matplotlib, the `dashboards` style sheet)
    series.py    the time series the figures draw
    cli.py       registers `lab report`
"""
