"""The port a part is told to listen on (lab.run.options.free_port): never one the kernel
may hand to a connection in the meantime, and never one that is taken."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from lab.run.options import LOWEST_LISTEN_PORT, ephemeral_range, free_port


def test_the_port_is_below_the_kernels_ephemeral_range_and_free() -> None:
    low, _ = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert LOWEST_LISTEN_PORT <= port < low
        with socket.create_server(("127.0.0.1", port)):  # a part can bind it
            pass


def test_a_taken_port_is_passed_over() -> None:
    seed = 7
    first = free_port(random.Random(seed))
    with socket.create_server(("127.0.0.1", first)):
        again = free_port(random.Random(seed))  # the same first candidate, now taken
        assert again != first
        with socket.create_server(("127.0.0.1", again)):
            pass


def test_no_room_below_the_range_falls_back_to_the_kernels_choice() -> None:
    low, high = ephemeral_range()
    port = free_port(ephemeral=(LOWEST_LISTEN_PORT + 10, high))
    assert low <= port <= high


def test_the_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    f.write_text("garbage")
    assert ephemeral_range(f) == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
