"""Processors reachable only at the addresses they advertise answer every lookup through any of them
(docs/deploy.md, "Endpoints"; docs/endpoints.md, "Who answers").

On Container Apps each replica is reachable by its peers only at its own address in the environment's network,
and registers that address (infra/modules/app.bicep). Here three processors of `examples/endpoints` (embedded
default coordination) stand in for three replicas: each binds one address of its own, 127.0.0.2, .3 and .4
(Linux routes all of 127/8 to the loopback interface), and nothing else — not 127.0.0.1, not another port. They
find each other only through the addresses in the registry, so a lookup sent to one processor for a key another
one owns is answered only if that processor forwards it to the right registered address.

Checked: the registry holds the three distinct addresses, one per processor, and nothing answers at 127.0.0.1 on
their ports; every user's latest view is the answer through each of the three; the bearer token is required on
every route but the health probe's (127.0.0.x is loopback, where weirflow would let a server run without a token:
set, it is enforced all the same).
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import unique_job_name
from tests.integration.endpoints_example import EXAMPLE, get
from tests.integration.endpoints_example import views as _views
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.endpoints.settings import is_loopback
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

send, view = _views.send, _views.view

ADDRESSES = {"p2": "127.0.0.2", "p3": "127.0.0.3", "p4": "127.0.0.4"}
USERS = 200
VIEWS = 1000
STAGE, TASKS = "views_by_user", 4  # the served table's tasks: key -> crc32 % 4
TOKEN = "t0ken-for-the-address-test"


def no_processor_answers(host: str, port: int) -> bool:
    """Whether no processor answers on ``host``:``port``: the connection is refused, or what listens there does
    not answer a processor's ``GET /healthz`` (``{"state": ...}``). The port is a processor's on another address;
    on this one another process may hold the same number (Spark binds random ports on 127.0.0.1), which a bare
    connection would take for the processor."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as response:
            body = json.loads(response.read())
    except Exception:  # not HTTP, or not JSON: not a processor
        return True
    return not (isinstance(body, dict) and "state" in body)


def every_key_answered(url: str, expected: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Ask ``url`` for every key until each got its row; return the answers that were neither the row nor a 503
    (a rebalance, e.g. a heartbeat late on this loaded machine, may answer 503 meanwhile: never anything else)."""
    missing, wrong = dict(expected), []

    def all_answered() -> bool:
        for user, row in list(missing.items()):
            answer = get(f"{url}/tables/last_view/{user}", TOKEN)
            if answer == (200, row):
                del missing[user]
            elif answer[0] != 503:
                wrong.append((url, user, answer))
        return not missing

    wait_until(all_answered, 120, f"every key answered through {url}", interval_s=1)
    return wrong


@pytest.mark.timeout(480)  # three Spark processes start at once (two cores here)
def test_processors_reachable_only_at_their_advertised_addresses_answer_lookups_through_any_of_them(
    tmp_path: Path, measure
) -> None:
    assert all(is_loopback(a) for a in ADDRESSES.values())  # on lo, so this needs no privileges
    shutil.copy(EXAMPLE / "job.yaml", tmp_path / "job.yaml")
    shutil.copy(EXAMPLE / "pipeline.py", tmp_path / "pipeline.py")
    config_path = tmp_path / "job.yaml"
    overrides = [
        f"job.name={unique_job_name('addresses')}",
        "job.debounce.time.ms=1000",
        f"endpoints.auth.token={TOKEN}",
    ]
    config = load_config(config_path, overrides)
    send(config, 0, VIEWS, USERS)
    expected = {f"u{u}": view(max(i for i in range(u, VIEWS, USERS)), USERS) for u in range(USERS)}

    procs: dict[str, ProcessorProcess] = {
        name: start_processor(
            config_path, name, [*overrides, f"endpoints.host={address}"], log_dir=tmp_path / "logs"
        )
        for name, address in ADDRESSES.items()
    }
    try:
        urls: dict[str, str] = {}
        owner_of: dict[str, str] = {}

        def registered() -> bool:
            """All three live, registered and holding tasks; `urls` and `owner_of` as the registry has them."""
            doc = status_document(config)
            live = {p["processor_id"]: p.get("endpoint") for p in doc["processors"] if p["live"]}
            if set(live) != set(ADDRESSES) or not all(live.values()) or len(doc["assignment"]) < 3:
                return False
            urls.update(live)
            owner_of.update({t: p for p, tasks in doc["assignment"].items() for t in tasks})
            return True

        def answered_through_all() -> bool:
            """Every key's last row through each processor: the tables have caught up with the whole input
            (a key of a task still reading answers 404 until then)."""
            return registered() and all(
                get(f"{url}/tables/last_view/{user}", TOKEN) == (200, row)
                for url in urls.values()
                for user, row in expected.items()
            )

        took = wait_until(
            answered_through_all, 300, "three processors answering lookups through each", interval_s=1
        )

        # each registered the one address it is bound to, and no processor answers on 127.0.0.1 at its port
        hosts = {name: urlsplit(url) for name, url in urls.items()}
        assert {name: parts.hostname for name, parts in hosts.items()} == ADDRESSES
        for parts in hosts.values():
            assert parts.port and no_processor_answers("127.0.0.1", parts.port)

        # every user's row through each processor: its own keys, and the others' forwarded to their addresses. A
        # rebalance (a heartbeat late on this loaded machine) may answer 503 meanwhile, never anything else
        forwarded, wrong = {}, []
        for name, url in urls.items():
            wrong += every_key_answered(url, expected)
            forwarded[name] = sum(
                owner_of[f"{STAGE}-{zlib.crc32(user.encode()) % TASKS}"] != name for user in expected
            )
        assert wrong == [], wrong[:5]
        assert sum(forwarded.values()) > 0, "no lookup needed another processor: the forwarding was not exercised"

        # the token: refused without it or with another, on every processor; the health probe needs none
        for url in urls.values():
            assert [
                get(f"{url}/tables/last_view/u1", None)[0],
                get(f"{url}/tables/last_view/u1", "wrong")[0],
                get(f"{url}/status", None)[0],
                get(f"{url}/healthz", None)[0],
            ] == [401, 401, 401, 200], url
    except Exception:
        for proc in procs.values():
            print(proc.log_text()[-3000:])
        raise
    finally:
        for proc in procs.values():
            proc.request_stop()
        for proc in procs.values():
            proc.wait_stopped(60)
    measure(
        f"endpoint addresses: 3 processors on 127.0.0.2-4 answered all {USERS} keys through each after "
        f"{took:.0f} s; lookups forwarded to a peer's address per entry: {forwarded}"
    )
