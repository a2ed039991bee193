"""Run kinesalite (npm ``kinesalite``, a local Kinesis implementation) for tests and benchmarks.

The suite reads and writes Kinesis through the unmodified boto3 client against it (moto's server gets splits
and merges wrong; docs/kinesis.md). `Kinesalite.start` runs the pinned copy from ``node_modules`` (installed
by ``make test`` from ``package.json``) through a few lines of node, with the stream-state delays at 0 so
streams are ACTIVE at once and can be resharded straight away, on a free port, in memory (each start is
empty).

This is a development tool of the test tree (not installed with weirflow); production jobs leave
``systems.<name>.endpoint`` unset and reach AWS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.support.faketime import libfaketime

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Dummy credentials: kinesalite checks that a request is signed, not by whom.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "weirflow",
    "AWS_SECRET_ACCESS_KEY": "weirflow",
    "AWS_DEFAULT_REGION": "us-east-1",
}

_LAUNCHER = """
// kinesalite rethrows a request's 'error' event, so a client hanging up mid-request (a SIGKILLed processor, a read
// time-out) killed the whole server: that request is gone, the server is not, and it goes on serving the others.
process.on('uncaughtException', (err) => {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error('a client hung up mid-request:', err.message);
    return;
  }
  console.error(err);
  process.exit(1);
});
const kinesalite = require(process.argv[1]);
const server = kinesalite({createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 10000});
server.listen(0, '127.0.0.1', (err) => {
  if (err) { console.error(err); process.exit(1); }
  console.log(server.address().port);
});
"""


class Kinesalite:
    """One kinesalite process on a free loopback port. With ``clock_file``, it runs under libfaketime (Debian's
    faketime, which ``make test`` installs) reading its clock offset from that file at every call ("+0",
    "+25h"): how a test ages records past the stream's retention."""

    def __init__(self, clock_file: Path | None = None) -> None:
        self.port = 0
        self.clock_file = clock_file
        self._proc: subprocess.Popen[str] | None = None
        self.log_path: Path | None = None  # its stderr: why it died, if it does

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Kinesalite:
        module = PROJECT_ROOT / "node_modules" / "kinesalite"
        if not module.exists():
            raise FileNotFoundError(f"kinesalite is missing: run `npm ci` in {PROJECT_ROOT} (make test does)")
        env = dict(os.environ)
        if self.clock_file is not None:
            env.update(
                {
                    "LD_PRELOAD": str(libfaketime()),
                    "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                    "FAKETIME_NO_CACHE": "1",
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                }
            )
        handle, name = tempfile.mkstemp(prefix="kinesalite-", suffix=".log")
        self.log_path = Path(name)
        with os.fdopen(handle, "w") as stderr:
            self._proc = subprocess.Popen(
                ["node", "-e", _LAUNCHER, str(module)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
                env=env,
            )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # the port, once it listens
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"kinesalite did not start (printed {line!r}): {self.stderr_tail()}")
        self.port = int(line)
        return self

    def config(self, system: str = "kinesis") -> dict[str, str]:
        """The ``systems.<system>.*`` keys of a job that uses this kinesalite."""
        return {
            f"systems.{system}.factory": "kinesis",
            f"systems.{system}.endpoint": self.endpoint,
            f"systems.{system}.region": "us-east-1",
        }

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stderr_tail(self, chars: int = 3000) -> str:
        """The end of what kinesalite wrote to stderr (a crash's stack, an out-of-memory report)."""
        if self.log_path is None or not self.log_path.exists():
            return "(no stderr)"
        return self.log_path.read_text(errors="replace")[-chars:] or "(nothing on stderr)"

    def stop(self) -> None:
        """Stop it; its stderr log goes too unless it had died (then it is kept to read)."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            if self.log_path is not None:
                self.log_path.unlink(missing_ok=True)
        self._proc = None


def use_dummy_credentials() -> None:
    """Give boto3's default chain credentials (kinesalite needs a signed request; none are real)."""
    for key, value in CREDENTIALS.items():
        os.environ.setdefault(key, value)
