"""The suite's Azurite helper (tests/support/azurite.py) survives a free port taken before Azurite binds it: a
first start moves to fresh ports, a restart keeps the ports its clients know."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.azurite import Azurite


def _held() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_first_start_whose_port_was_taken_moves_to_fresh_ports(tmp_path: Path) -> None:
    azurite = Azurite(tmp_path / "azurite")
    with _held() as taken:
        azurite.queue_port = taken.getsockname()[1]  # as if another process bound it after `free_port`
        azurite.start()
        try:
            assert azurite.running()
            assert azurite.queue_port != taken.getsockname()[1]
            assert b"EADDRINUSE" in azurite.log_path.read_bytes(), "the first attempt did meet the taken port"
        finally:
            azurite.stop()


def test_a_restart_keeps_its_ports_and_says_why_it_cannot(tmp_path: Path) -> None:
    azurite = Azurite(tmp_path / "azurite").start()
    ports = (azurite.blob_port, azurite.table_port, azurite.queue_port)
    azurite.stop()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", azurite.queue_port))
        taken.listen()
        with pytest.raises(RuntimeError, match="Azurite exited"):
            azurite.start()
    assert (azurite.blob_port, azurite.table_port, azurite.queue_port) == ports
    azurite.start()
    try:
        assert azurite.running() and (azurite.blob_port, azurite.table_port, azurite.queue_port) == ports
    finally:
        azurite.stop()
