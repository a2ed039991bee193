"""A Spark standalone cluster for tests: one master and one worker started from the pip-installed PySpark's
own launcher (``pyspark/bin/spark-class``), on loopback, on free ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.azurite import free_port


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """``master_url`` is ``spark://127.0.0.1:<port>``; `applications` reads the master's JSON status page."""

    def __init__(self, work_dir: Path, cores: int = 2, memory: str = "2g") -> None:
        self.work_dir = Path(work_dir)
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        home = _spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_WORKER_DIR": str(self.work_dir / "work"),
        }
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / f"{name}.log", "ab")
        self._procs.append(
            subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as response:
            return json.loads(response.read())

    def applications(self) -> list[dict[str, Any]]:
        """Running and completed applications (name, cores, state), as the master lists them."""
        status = self.status()
        return list(status.get("activeapps", [])) + list(status.get("completedapps", []))

    def start(self, timeout_s: float = 90) -> StandaloneCluster:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        deadline = time.monotonic() + timeout_s
        # the worker only once the master leads: one that registers while the master is still in standby (its web
        # UI starting) is ignored, and tries again only 5 to 15 s later (Spark's initial registration interval)
        if self._until(lambda status: status.get("status") == "ALIVE", deadline):
            self._start(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(self.work_dir / "work"),
            )
            if self._until(
                lambda status: any(w.get("state") == "ALIVE" for w in status.get("workers", [])), deadline
            ):
                return self
        logs = "\n".join(
            (self.work_dir / f"{n}.log").read_text(errors="replace")[-2000:]
            for n in ("master", "worker")
            if (self.work_dir / f"{n}.log").exists()
        )
        self.stop()
        raise RuntimeError(f"the Spark standalone cluster did not come up in {timeout_s:.0f} s:\n{logs}")

    def _until(self, condition: Callable[[dict[str, Any]], bool], deadline: float) -> bool:
        """Poll the master's status until ``condition`` holds (True), a process died or ``deadline`` passed. Seen
        once while a master started: its web UI answered ``/json/`` with an HTML page instead of the JSON status,
        which counts as not up yet, like a refused connection."""
        while time.monotonic() < deadline:
            try:
                if condition(self.status()):
                    return True
            except (OSError, ValueError):  # not listening yet, or not answering JSON yet
                pass
            if any(p.poll() is not None for p in self._procs):
                return False
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
