"""Run moto's server (pip ``moto[server]``, pinned in pyproject.toml's dev extra): a local DynamoDB and S3 for the
AWS suite's tests and benchmarks, reached through the unmodified boto3 clients.

`MotoServer.start` runs moto's server on a free loopback port and waits until it answers, then makes one request
to each service the suite uses. moto loads a service's backend on that service's first request (0.45 s for DynamoDB
on an idle machine), and the contract suite's AWS backend allows one request 1 s (tests/contract/backends.py): a
first request under a loaded machine's set-up timed out. State is in memory: each start is empty.

**One request at a time.** moto evaluates a conditional write's condition and applies the write without a lock,
so under concurrent requests two writers conditional on the same counter can both succeed (measured: 7 double
wins in 351 contended updates from 8 threads). DynamoDB and S3 decide a condition and its write atomically, and
the AWS suite's leases, fences and compare-and-set rest on that. The launcher therefore serves moto's WSGI app
behind one lock, which gives the emulator the services' atomicity; the suite's correctness under real
contention is then what the tests see (docs/aws.md, "What is verified here, and what only on AWS").

Tests give every job its own name, hence its own tables and S3 prefix, so one server serves the whole session.
(Kinesis stays on kinesalite: docs/kinesis.md says why.)

This is a development tool of the test tree (not installed with weirflow); production jobs leave
``aws.endpoint.url`` unset and reach AWS.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.kinesalite import use_dummy_credentials

BUCKET = "weirflow-tests"

# moto's own `moto.server` main, with every request handled under one lock (see the module docstring).
_LAUNCHER = """
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
one_at_a_time = threading.Lock()

def serialized(environ, start_response):
    with one_at_a_time:
        return list(app(environ, start_response))  # the whole reply is made under the lock

run_simple(sys.argv[1], int(sys.argv[2]), serialized, threaded=True, request_handler=MotoRequestHandler)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoServer:
    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> MotoServer:
        use_dummy_credentials()
        self.port = _free_port()
        handle, name = tempfile.mkstemp(prefix="moto-", suffix=".log")
        self.log_path = Path(name)
        with os.fdopen(handle, "w") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, "127.0.0.1", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:  # a condition polled: the server answering its health page
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto's server exited at start: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    pass
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"moto's server did not answer within {timeout_s:.0f} s: {self.log_tail()}"
                    ) from None
                time.sleep(0.1)
                continue
            self._load_services(timeout_s)
            return self

    def _load_services(self, timeout_s: float) -> None:
        """One request to DynamoDB and one to S3, with no time limit shorter than the start's: each loads its
        service's backend in the server (see the module docstring)."""
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 0})
        for service, operation in (("dynamodb", "list_tables"), ("s3", "list_buckets")):
            client = boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1", config=config)
            try:
                getattr(client, operation)()
            finally:
                client.close()

    def config(self, bucket: str = BUCKET) -> dict[str, str]:
        """The ``aws.*`` keys of a job whose coordination, checkpoints and metadata live on this server."""
        return {"aws.endpoint.url": self.endpoint, "aws.region": "us-east-1", "aws.s3.bucket": bucket}

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-chars:] or "(empty log)"

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        self._proc = None
