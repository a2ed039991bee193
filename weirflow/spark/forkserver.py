"""A warm fork server for the Python processes Spark starts: each streaming query's planner, and the daemons.

Spark starts one Python process per streaming query that reads a Python data source
(``pyspark.sql.streaming.python_streaming_source_runner``): it asks the weirflow source for offsets and
partitions at every micro-batch, for as long as the query runs. Spark starts it as a new interpreter, not from
its worker daemon, so every query start paid for importing PySpark, pyarrow and weirflow again: measured with
py-spy on the 2-core machine, 1.5 to 3 s of CPU per query, most of a processor's start-up CPU once it runs more
than a handful of queries (docs/pipelines.md, "Start-up"). Spark also starts a new interpreter for each of
PySpark's worker daemons (`weirflow.spark.daemon`: one for the executor's workers, one for each kind of the
driver's data source work: lookup, create, plan a read, write, commit), each importing PySpark, pyarrow and
pandas again: forking those too took a processor of the example job from 23-28 s of CPU to 15-23 s to start,
count 200 events and stop (5 to 9 s less in each of 7 pairs of runs).

So a processor starts this module first, as its own process: it imports those modules once, then waits on a Unix
socket. The launcher Spark runs for Python (`weirflow.spark.session.worker_python`) hands a request to start the
runner or a daemon to it instead of starting an interpreter: a small client (``CLIENT``, standard library only,
started without ``site``) sends its arguments, environment, working directory and standard streams
(``SCM_RIGHTS``); the server forks a child that takes them over and runs the module as ``__main__``, as
``python -m`` would. The client stays as the process Spark knows: it forwards SIGTERM, SIGINT and SIGHUP to the
child and exits with the child's status, and if the client is killed the server kills the child. A client that
cannot reach the server, or a request the server does not serve, runs the interpreter as before, so the server only
ever saves time.

The server exits when the processor does (its standard input, a pipe from the processor, closes). Only the
processor's user can connect (the socket's folder is private to it). `task.spark.planner.fork` turns it off.
"""

from __future__ import annotations

import array
import contextlib
import gc
import importlib
import io
import json
import os
import random
import runpy
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import Any

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
DAEMON = "weirflow.spark.daemon"  # Spark's Python worker daemons (weirflow/spark/daemon.py)
SERVED = (RUNNER, DAEMON)
ENV = "WEIRFLOW_FORK_SERVER"
_STARTED, _DECLINED = b"F", b"X"
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# The launcher's client: standard library only and started with `python -I -S`, so it costs milliseconds. Any
# failure before the server accepted the request runs the module the usual way.
CLIENT = """\
import array, json, os, signal, socket, struct, sys


def run_here():
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


def read(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


try:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.environ["WEIRFLOW_FORK_SERVER"])
    body = json.dumps({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    fds = array.array("i", [0, 1, 2])
    conn.sendmsg([struct.pack("!I", len(body)) + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    started = read(conn, 1) == b"F"
except OSError:
    started = False
if not started:
    run_here()
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, lambda signum, _frame: conn.sendall(bytes([signum])))
status = read(conn, 4)
code = struct.unpack("!i", status)[0] if status else 1
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code)
"""


# --- the processor's side -------------------------------------------------------------------------------------
_server: subprocess.Popen[bytes] | None = None


def preload_modules() -> list[str]:
    """What the server imports: the runner and the weirflow modules this processor has loaded (the data
    source, config, the job's systems and checkpoints, which unpickling the source imports), not the HTTP
    endpoints or the command line, which a runner never needs."""
    skip = ("weirflow.endpoints", "weirflow.cli", "weirflow.__main__")
    loaded = sorted(m for m in sys.modules if m.split(".")[0].startswith("weirflow") and not m.startswith(skip))
    return [RUNNER, DAEMON, "weirflow.spark.source", *loaded]


def start_fork_server() -> str:
    """Start this processor's fork server (once) and point the launcher at it through ``WEIRFLOW_FORK_SERVER``;
    returns the socket's path. Spark's Python processes inherit the environment the JVM started with, so this
    runs before the session."""
    global _server
    if _server is not None and _server.poll() is None:
        return os.environ[ENV]
    folder = tempfile.mkdtemp(prefix="weirflow-fork-")  # private to this user (0700)
    path = os.path.join(folder, "planner.sock")
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}  # what PySpark gives workers
    command = [sys.executable, "-m", "weirflow.spark.forkserver", path, ",".join(SERVED), *preload_modules()]
    _server = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
    os.environ[ENV] = path
    return path


# --- the server ----------------------------------------------------------------------------------------------
_connections: set[socket.socket] = set()  # clients being served: a new child closes its copies of them


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client left before its request was read")
        body += chunk
    return json.loads(body), list(fds)


def _watch(conn: socket.socket, pid: int) -> None:
    """Forward the client's signals to the child, kill the child if the client goes, and send the client the
    child's exit status (negative: the signal that ended it)."""
    reaped = threading.Event()

    def reap() -> None:
        _pid, status = os.waitpid(pid, 0)
        reaped.set()
        with contextlib.suppress(OSError):
            conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=reap, name=f"reap-{pid}", daemon=True).start()
    while True:
        try:
            data = conn.recv(16)
        except OSError:
            data = b""
        if not data:
            break
        for number in data:
            if not reaped.is_set():
                with contextlib.suppress(OSError):
                    os.kill(pid, number)
    if not reaped.is_set():  # the client was killed: so is what it stood for
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _connections.discard(conn)
    conn.close()


def _child(listener: socket.socket, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python -m <module>`` run by the client, then exit with its status."""
    code: Any = 1
    try:
        listener.close()
        for other in (conn, *_connections):
            other.close()
        for number in _FORWARDED:
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[1:1] = extra
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        random.seed()
        module = request["argv"][1]
        sys.argv = [module, *request["argv"][2:]]
        sys.modules.pop(module, None)  # preloaded as a module; it runs again as __main__
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _exit_with_the_processor() -> None:
    sys.stdin.buffer.read()  # returns at EOF: the processor exited (or was killed)
    os._exit(0)


def serve(path: str, served: list[str], preload: list[str]) -> None:
    """Accept requests to run one of the ``served`` modules on the socket at ``path`` until the processor exits,
    having imported ``preload`` first.

    The socket exists before the imports: the launcher uses the server once it sees the socket, so a request
    that comes while the server still imports (Spark starts its first daemons seconds after the processor
    starts this server) waits in the socket's backlog instead of starting an interpreter of its own."""
    threading.Thread(target=_exit_with_the_processor, name="processor-watch", daemon=True).start()
    seed = os.environ.get("PYTHONHASHSEED")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = f"{path}.{os.getpid()}"
    listener.bind(partial)
    listener.listen(64)
    os.rename(partial, path)
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a runner imports it itself then
            print(f"weirflow fork server: could not preload {name}: {exc}", file=sys.stderr)
    gc.freeze()  # forked children do not copy the preloaded heap when a collection walks it
    while True:
        conn, _addr = listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            continue
        argv = request.get("argv") or []
        serves = len(argv) >= 2 and argv[0] == "-m" and argv[1] in served
        if not serves or request.get("env", {}).get("PYTHONHASHSEED") != seed or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(_DECLINED)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            _child(listener, conn, request, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(_STARTED)
        except OSError:
            os.kill(pid, signal.SIGKILL)
        _connections.add(conn)
        threading.Thread(target=_watch, args=(conn, pid), name=f"watch-{pid}", daemon=True).start()


if __name__ == "__main__":  # PATH SERVED[,SERVED...] [PRELOAD...]
    serve(sys.argv[1], sys.argv[2].split(","), sys.argv[3:])
