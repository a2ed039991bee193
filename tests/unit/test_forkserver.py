"""The planner fork server (weirflow/spark/forkserver.py) with real processes: a client started the way
weirflow's launcher starts it gets a forked child that runs the module as ``python -m`` would, with the client's
arguments, environment, directory and standard streams; the client's exit code, signals and death are the
child's; anything the server does not serve runs in the client itself, as before; and Spark's worker daemons,
started through the launcher, are forked by the server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from weirflow.spark import forkserver
from weirflow.spark.session import worker_python
from weirflow.testing import wait_until

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.unit.forkserver_target"


@contextlib.contextmanager
def _fork_server(socket_path: Path, served: list[str], preload: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A fork server as a processor starts it; stopped as when the processor exits (its stdin closes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    command = [sys.executable, "-m", "weirflow.spark.forkserver", str(socket_path), ",".join(served), *preload]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
    try:
        wait_until(socket_path.exists, 30, "the fork server's socket", 0.05)
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(30) == 0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    socket_path = tmp_path / "planner.sock"
    with _fork_server(socket_path, [TARGET], ["json"]):
        yield socket_path


def _client(tmp_path: Path, socket_path: Path | None, module: str = TARGET, **env: str) -> subprocess.Popen[str]:
    client = tmp_path / "client.py"
    client.write_text(forkserver.CLIENT)
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", **env}
    environment[forkserver.ENV] = str(socket_path or tmp_path / "absent.sock")
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(client), "-m", module, "an-argument"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
        env=environment,
        text=True,
    )


def _report(client: subprocess.Popen[str]) -> dict[str, object]:
    assert client.stdout is not None
    return json.loads(client.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent counts as gone
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped since the signal above (open or read fails)
        return True


def test_the_child_runs_with_the_clients_arguments_environment_directory_streams_and_exit_code(server, tmp_path):
    client = _client(tmp_path, server, FORK_TARGET="from-the-client", FORK_TARGET_EXIT="7")
    report = _report(client)
    assert client.wait(30) == 7
    assert report["pid"] != client.pid  # forked by the server, not run in the client
    assert report == {**report, "cwd": str(tmp_path), "argv": ["an-argument"], "env": "from-the-client"}


def test_sigterm_to_the_client_ends_the_child_and_the_client_reports_it(server, tmp_path):
    client = _client(tmp_path, server)
    child = int(_report(client)["pid"])  # type: ignore[call-overload]
    client.send_signal(signal.SIGTERM)
    assert client.wait(30) == -signal.SIGTERM
    wait_until(lambda: _gone(child), 30, "the child to end", 0.05)


def test_a_killed_client_takes_its_child_with_it(server, tmp_path):
    client = _client(tmp_path, server)
    child = int(_report(client)["pid"])  # type: ignore[call-overload]
    client.kill()
    client.wait(30)
    wait_until(lambda: _gone(child), 30, "the child of a SIGKILLed client to be killed", 0.05)


def test_closing_the_childs_stdin_ends_it_normally(server, tmp_path):
    client = _client(tmp_path, server)
    child = int(_report(client)["pid"])  # type: ignore[call-overload]
    assert client.stdin is not None
    client.stdin.close()
    assert client.wait(30) == 0
    assert child != client.pid


def test_a_request_the_server_declines_runs_in_the_client_itself(server, tmp_path):
    # another hash seed than the server's: a forked child could not honour it
    client = _client(tmp_path, server, PYTHONHASHSEED="1", FORK_TARGET_EXIT="3")
    report = _report(client)
    assert client.wait(30) == 3
    assert report["pid"] == client.pid  # the client exec'd the module itself


def test_without_a_server_the_client_runs_the_module_itself(tmp_path):
    client = _client(tmp_path, None, FORK_TARGET_EXIT="3")
    report = _report(client)
    assert client.wait(30) == 3
    assert report["pid"] == client.pid


def test_sparks_worker_daemons_started_through_the_launcher_are_forked_by_the_server(tmp_path):
    """Spark starts PySpark's daemon (``-m pyspark.daemon <module>``) through weirflow's launcher: the launcher
    hands it to the fork server as `weirflow.spark.daemon`, which the server forks with PySpark, pyarrow and
    pandas already imported; the daemon works as Spark expects (its port on stdout, gone when stdin closes)."""
    socket_path = tmp_path / "planner.sock"
    with _fork_server(socket_path, list(forkserver.SERVED), [forkserver.DAEMON]) as server:
        daemon = subprocess.Popen(
            [worker_python(), "-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONHASHSEED": "0", forkserver.ENV: str(socket_path)},
        )
        assert daemon.stdout is not None and daemon.stdin is not None
        port = int.from_bytes(daemon.stdout.read(4), "big")  # PySpark's daemon: its port, then it serves
        assert 0 < port < 65536
        children = _children(server.pid)
        assert len(children) == 1 and children[0] != daemon.pid, "the daemon was not forked by the server"
        daemon.stdin.close()  # Spark's way to stop a daemon (PySpark's own then exits with status 1)
        daemon.wait(30)
        wait_until(lambda: _gone(children[0]), 30, "the forked daemon to end", 0.05)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            found += [int(child) for child in listing.read().split()]
    return found
