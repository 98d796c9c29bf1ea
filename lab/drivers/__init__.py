"""Thin I/O drivers that carry out a ClientCore's commands.

    sync         httpx.Client, threads (greenlets under Locust/gevent)
    trio_driver  httpx.AsyncClient on trio, one task per connection

Never import both in one process: importing Locust patches the process with gevent, and
trio then breaks (seen, not supposed). This package's __init__ imports neither.
"""
