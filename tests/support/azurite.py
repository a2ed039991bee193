"""Run Azurite (Microsoft's Azure Storage emulator, npm ``azurite``) for development, tests and benchmarks.

The suite runs the Azure implementations for real against it: `Azurite.start` launches the project's pinned
copy (``node_modules/.bin/azurite``, installed by ``make test`` from ``package.json``) on free ports with its
own data directory, waits until blob and table endpoints accept connections, and gives the connection
string. `stop` + `start` again with the same object restarts it on the same ports and data directory, which
is how tests take storage away from running processors and give it back.

This is a development tool of the test tree (not installed with weirflow); production jobs point
``azure.storage.*`` at a real account.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, documented by Microsoft; not a secret).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def azurite_executable() -> str:
    """The pinned Azurite of this checkout, else one on PATH."""
    local = PROJECT_ROOT / "node_modules" / ".bin" / "azurite"
    if local.exists():
        return str(local)
    found = shutil.which("azurite")
    if found:
        return found
    raise FileNotFoundError(
        f"Azurite is not installed: run `npm ci` in {PROJECT_ROOT} (make test does it), or `npm i -g azurite`"
    )


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Azurite:
    """One Azurite process: blob and table services on free ports, data in ``data_dir``; ``extra_args`` are
    passed to Azurite as they are (HTTPS and OAuth: ``--cert``, ``--key``, ``--oauth basic``)."""

    def __init__(self, data_dir: Path, log_path: Path | None = None, extra_args: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.log_path = log_path or self.data_dir / "azurite.log"
        self.extra_args = tuple(extra_args)
        self.blob_port = free_port()
        self.table_port = free_port()
        self.queue_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._listened = False  # once it has listened, a restart keeps its ports (clients know them)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.blob_port}/{ACCOUNT};"
            f"TableEndpoint=http://127.0.0.1:{self.table_port}/{ACCOUNT};"
        )

    def start(self, timeout_s: float = 60) -> Azurite:
        """Start it and wait until blob and table accept connections. A free port can be taken between
        `free_port` and Azurite's bind (an outgoing connection's ephemeral port, another test's server): a
        first start that fails so (``EADDRINUSE`` in its log) is retried on fresh ports, up to three times; a
        restart keeps its ports, which clients already know."""
        for attempt in range(3):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start_once(timeout_s)
            except RuntimeError:
                if self._listened or attempt == 2 or b"EADDRINUSE" not in self._log_since(logged):
                    raise
                self.blob_port, self.table_port, self.queue_port = free_port(), free_port(), free_port()
        raise AssertionError("unreachable")

    def _log_since(self, offset: int) -> bytes:
        try:
            return self.log_path.read_bytes()[offset:]
        except FileNotFoundError:
            return b""

    def _start_once(self, timeout_s: float) -> Azurite:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            azurite_executable(),
            "--silent",
            "--skipApiVersionCheck",  # the SDKs may be newer than the emulator
            "--disableProductStyleUrl",
            "--location",
            str(self.data_dir),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.blob_port),
            "--tableHost",
            "127.0.0.1",
            "--tablePort",
            str(self.table_port),
            "--queueHost",
            "127.0.0.1",
            "--queuePort",
            str(self.queue_port),
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not (_port_open(self.blob_port) and _port_open(self.table_port)):
            if self._proc.poll() is not None:
                raise RuntimeError(f"Azurite exited with {self._proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"Azurite did not listen on {self.blob_port}/{self.table_port} in {timeout_s} s"
                )
            time.sleep(0.1)
        self._listened = True
        return self

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 3) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``. Azurite saves its databases on SIGTERM at once but then
        waits for every client to hang up, which pooled SDK connections never do: the kill ends that wait
        (data written before the stop survives a restart; checked by the suite)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
