"""Served tables (docs/endpoints.md): the files a task keeps them in, the pipeline rule that makes keys
routable, and the routing between processors — two real HTTP servers (uvicorn) answering for each other."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest

from weirflow.endpoints.server import EndpointServer, create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.tables import TableService
from weirflow.pipeline.api import App, PipelineError
from weirflow.pipeline.plan import PipelinePlan
from weirflow.runtime.served_tables import COMPACT_EVERY, TableReader, write_batch


def commit(location: Path, batch: int) -> None:
    (location / "commits").mkdir(parents=True, exist_ok=True)
    (location / "commits" / str(batch)).write_text("v1\n{}\n")


def test_a_reader_sees_a_batch_only_once_spark_committed_it(tmp_path: Path) -> None:
    write_batch(tmp_path, "t", 0, {"a": '{"v": 1}'})
    reader = TableReader(tmp_path, "t")
    assert reader.get("a") is None  # written, not committed: a failed batch must never show
    commit(tmp_path, 0)
    assert reader.get("a") == '{"v": 1}'
    write_batch(tmp_path, "t", 1, {"a": '{"v": 2}', "b": '{"v": 1}'})
    assert reader.get("a") == '{"v": 1}'
    write_batch(tmp_path, "t", 1, {"a": '{"v": 3}'})  # Spark replayed batch 1: its second write wins
    commit(tmp_path, 1)
    assert reader.get("a") == '{"v": 3}' and reader.get("b") is None


def test_compaction_keeps_the_table_and_bounds_the_files(tmp_path: Path) -> None:
    reader = TableReader(tmp_path, "t")
    for batch in range(3 * COMPACT_EVERY + 2):
        write_batch(tmp_path, "t", batch, {f"k{batch % 5}": json.dumps({"batch": batch}), f"only{batch}": "1"})
        commit(tmp_path, batch)
        if batch % 7 == 0:
            assert reader.get(f"k{batch % 5}") == json.dumps({"batch": batch})
    assert {k: json.loads(reader.get(k) or "null")["batch"] for k in ("k0", "k1", "k2", "k3", "k4")} == {
        f"k{b % 5}": b for b in range(3 * COMPACT_EVERY + 2 - 5, 3 * COMPACT_EVERY + 2)
    }
    assert len(reader) == 5 + 3 * COMPACT_EVERY + 2
    files = sorted(p.name for p in (tmp_path / "served" / "t").iterdir())
    assert len(files) <= 2 * COMPACT_EVERY + 1 and sum(f.endswith(".snapshot") for f in files) == 2
    fresh = TableReader(tmp_path, "t")  # a new owner reading the same directory (the task moved)
    assert dict(fresh.scan()) == dict(reader.scan())
    assert [k for k, _ in fresh.scan(prefix="k")] == ["k0", "k1", "k2", "k3", "k4"]
    assert [k for k, _ in fresh.scan(prefix="k", after="k2")] == ["k3", "k4"]


def test_a_replaced_directory_is_read_from_scratch(tmp_path: Path) -> None:
    write_batch(tmp_path, "t", 5, {"a": "1"})
    commit(tmp_path, 5)
    reader = TableReader(tmp_path, "t")
    assert reader.get("a") == "1"
    import shutil

    shutil.rmtree(tmp_path / "served")
    shutil.rmtree(tmp_path / "commits")
    write_batch(tmp_path, "t", 0, {"b": "2"})  # a fresh Spark checkpoint starts again at batch 0
    commit(tmp_path, 0)
    assert reader.get("b") == "2" and reader.get("a") is None


# --- the pipeline rule ------------------------------------------------------------------------------------
class _Config:
    def get(self, key: str, default: Any = None) -> Any:
        return {"job.name": "j", "job.id": "1"}.get(key, default)


def test_a_table_must_be_served_from_a_stage_partitioned_by_its_key() -> None:
    app = App()
    views = app.input("views")
    views.partition_by("user").serve("last", key="user")
    plan = PipelinePlan(app, _Config(), systems=None)
    plan._partitions["partition-by-0"] = 4
    assert plan.tables["last"].stage == "partition_by_0"
    for user in ("u1", "u42", "ü"):
        assert plan.table_task("last", user) == f"partition_by_0-{zlib.crc32(user.encode()) % 4}"

    wrong = App()
    wrong.input("views").partition_by("page").serve("last", key="user")
    with pytest.raises(PipelineError, match=r"not partitioned by 'user'; call .partition_by\('user'\)"):
        PipelinePlan(wrong, _Config(), systems=None)
    unpartitioned = App()
    unpartitioned.input("views").serve("last", key="user")
    with pytest.raises(PipelineError, match="not partitioned by 'user'"):
        PipelinePlan(unpartitioned, _Config(), systems=None)
    with pytest.raises(PipelineError, match="table name"):
        App().input("v").serve("no/slash", key="user")
    twice = App()
    stream = twice.input("v").partition_by("user")
    stream.serve("t", key="user")
    with pytest.raises(PipelineError, match="served twice"):
        stream.serve("t", key="user")


# --- routing between processors -------------------------------------------------------------------------
class _Plan:
    """Two tasks, ``s-0`` and ``s-1``; a key's task is the number it ends with."""

    tables = {"t": object()}

    def table_task(self, table: str, key: str) -> str:
        return f"s-{int(key[-1]) % 2}"

    def table_tasks(self, table: str) -> list[str]:
        return ["s-0", "s-1"]


class _Job:
    """What two processors agree on: the job model's owner of each task, their URLs, and which tasks each
    serves now (a task restoring, or a processor gone, serves nothing)."""

    def __init__(self, tmp: Path) -> None:
        self.owner = {"s-0": "p0", "s-1": "p1"}
        self.urls: dict[str, str] = {}
        self.serving = {"p0": {"s-0"}, "p1": {"s-1"}}
        self.dirs = {task: tmp / task for task in ("s-0", "s-1")}

    def service(self, me: str, token: str | None) -> TableService:
        def table(task: str, name: str) -> TableReader | None:
            return TableReader(self.dirs[task], name) if task in self.serving[me] else None

        return TableService(_Plan(), me, self.owner.get, table, lambda: dict(self.urls), token, wait_s=0.5)


def get(url: str, token: str | None = None) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


@pytest.fixture
def two_processors(tmp_path: Path) -> Any:
    job = _Job(tmp_path)
    for task, n in (("s-0", 0), ("s-1", 1)):
        rows = {f"k{i}": json.dumps({"key": f"k{i}", "n": i}) for i in range(n, 40, 2)}
        write_batch(job.dirs[task], "t", 0, rows)
        commit(job.dirs[task], 0)
    token = "s3cret"
    settings = EndpointSettings(True, "127.0.0.1", 0, None, token)
    servers = {}
    for me in ("p0", "p1"):
        app = create_app(settings, dict, lambda: (True, "RUNNING"), lambda: b"", job.service(me, token))
        servers[me] = EndpointServer(settings, app)
        job.urls[me] = servers[me].start()
    yield job, token
    for server in servers.values():
        server.stop()


def test_any_processor_answers_any_key_through_the_owner(two_processors: Any) -> None:
    job, token = two_processors
    for entry in ("p0", "p1"):
        for key in ("k0", "k1", "k7", "k38"):
            status, row, headers = get(f"{job.urls[entry]}/tables/t/{key}", token)
            assert (status, row) == (200, {"key": key, "n": int(key[1:])}), (entry, key)
    status, body, _ = get(f"{job.urls['p0']}/tables/t/k41", token)  # owned by p1, absent there
    assert status == 404 and body == {"error": "no row for key 'k41' in table 't'"}
    # a listing gathers every task's rows, in key order, page by page
    keys, after = [], None
    while True:
        url = f"{job.urls['p0']}/tables/t?prefix=k1&limit=3" + (f"&after={after}" if after else "")
        status, page, _ = get(url, token)
        assert status == 200
        keys += [r["key"] for r in page["rows"]]
        assert all(r["row"]["key"] == r["key"] for r in page["rows"])
        if not (after := page["next"]):
            break
    assert keys == sorted(f"k{i}" for i in range(40) if str(i).startswith("1"))


def test_bad_requests_get_a_json_error(two_processors: Any) -> None:
    job, token = two_processors
    url = job.urls["p1"]
    status, body, headers = get(f"{url}/tables/t/k1")
    assert status == 401 and "bearer token" in body["error"] and headers["www-authenticate"] == "Bearer"
    status, body, _ = get(f"{url}/tables/nope/k1", token)
    assert status == 404 and body["error"] == "no table 'nope' in this job (served tables: t)"
    status, body, _ = get(f"{url}/tables/t/%ff%fe", token)
    assert status == 400 and "not valid UTF-8" in body["error"]
    status, body, _ = get(f"{url}/tables/t?limit=many", token)
    assert status == 400 and "limit must be an integer" in body["error"]
    status, body, _ = get(f"{url}/tables/t?limit=0", token)
    assert status == 400 and "limit must be 1-1000" in body["error"]


def test_while_no_processor_serves_a_key_it_gets_503_never_a_wrong_answer(two_processors: Any) -> None:
    job, token = two_processors
    job.serving["p1"] = set()  # p1 lost s-1 (its lock, or its process); the model still names it
    status, body, headers = get(f"{job.urls['p0']}/tables/t/k1", token)
    assert status == 503 and headers["retry-after"] == "1" and "moving between processors" in body["error"]
    status, body, _ = get(f"{job.urls['p1']}/tables/t/k1", token)
    assert status == 503
    status, _, _ = get(f"{job.urls['p0']}/tables/t?prefix=k", token)
    assert status == 503
    # the next model gives s-1 to p0, which restores the task (same directory here) and serves it
    job.owner["s-1"] = "p0"
    job.serving["p0"].add("s-1")
    assert get(f"{job.urls['p1']}/tables/t/k1", token)[:2] == (200, {"key": "k1", "n": 1})
    assert get(f"{job.urls['p0']}/tables/t/k1", token)[:2] == (200, {"key": "k1", "n": 1})


def test_a_processor_reached_with_an_old_model_says_so_and_the_entry_routes_again(two_processors: Any) -> None:
    job, token = two_processors
    # p0's view: p1 owns s-1 — but p1 moved it to p0 and p0 already serves it: p1 answers 409 to the hop,
    # and p0, asked again after its own model changes, answers itself
    job.serving["p1"] = set()
    job.serving["p0"].add("s-1")
    hop = urllib.request.Request(
        f"{job.urls['p1']}/tables/t/k1", headers={"Authorization": f"Bearer {token}", "X-Weirflow-Hop": "p0"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(hop, timeout=5)
    assert refused.value.code == 409
    job.owner["s-1"] = "p0"
    assert get(f"{job.urls['p1']}/tables/t/k3", token)[:2] == (200, {"key": "k3", "n": 3})
