"""Per-stream source settings: `start`, `system-columns`, `max-events-per-trigger`. No Spark, no services."""

from __future__ import annotations

import datetime as dt

import pytest

from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config
from weirflow.interfaces.system import RecordField
from weirflow.job.start_position import parse_start
from weirflow.spark.input_settings import system_fields


class _Admin:
    """A fake of our own `SystemAdmin.record_fields` (all these functions use)."""

    def __init__(self, fields: tuple[RecordField, ...]) -> None:
        self.fields = fields

    def record_fields(self) -> tuple[RecordField, ...]:
        return self.fields


EVENT_HUBS = _Admin(
    (
        RecordField("properties", "map<string,string>", ""),
        RecordField("enqueued_time", "timestamp", ""),
        RecordField("offset", "string", ""),
    )
)


EIGHT_UTC_MS = int(dt.datetime(2026, 11, 20, 8, tzinfo=dt.UTC).timestamp() * 1000)


def _config(**stream: object) -> Config:
    return Config.from_dict({"job.name": "j", "streams": {"views": stream}}, source="job.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "earliest"),
        ("Latest", "latest"),
        ("2026-11-20T08:00:00Z", EIGHT_UTC_MS),
        ("2026-11-20T08:00:00", EIGHT_UTC_MS),
        ("2026-11-20T09:00:00.250+01:00", EIGHT_UTC_MS + 250),
    ],
)
def test_start_is_a_keyword_or_a_time_in_epoch_milliseconds(text: str | None, expected: object) -> None:
    config = _config(**({"start": text} if text else {}))
    assert parse_start(config, "views") == expected


def test_a_bad_start_names_the_key_and_the_file() -> None:
    with pytest.raises(ConfigError, match=r"key 'streams.views.start' in job.yaml: 'yesterday' is neither"):
        parse_start(_config(start="yesterday"), "views")


def test_system_columns_select_all_some_or_none() -> None:
    assert system_fields(_config(), "views", EVENT_HUBS, []) == ()
    assert [n for n, _ in system_fields(_config(**{"system-columns": "all"}), "views", EVENT_HUBS, [])] == [
        "properties",
        "enqueued_time",
        "offset",
    ]
    picked = system_fields(_config(**{"system-columns": "offset, properties"}), "views", EVENT_HUBS, [])
    assert picked == (("offset", "string"), ("properties", "map<string,string>"))


def test_system_columns_errors_name_the_key_and_what_is_offered() -> None:
    with pytest.raises(ConfigError, match=r"streams.views.system-columns.*sequence: not a column.*properties"):
        system_fields(_config(**{"system-columns": "sequence"}), "views", EVENT_HUBS, [])
    with pytest.raises(ConfigError, match=r"streams.views.system-columns.*offset would replace"):
        system_fields(_config(**{"system-columns": "all"}), "views", EVENT_HUBS, ["user", "offset"])
    with pytest.raises(ConfigError, match=r"streams.views.system-columns.*has no record columns"):
        system_fields(_config(**{"system-columns": "all"}), "views", _Admin(()), [])


class _NoTimeAdmin(_Admin):
    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        raise NotImplementedError


def test_a_start_time_on_a_system_that_cannot_seek_by_time_is_a_config_error() -> None:
    from weirflow.interfaces.system import SystemStreamPartition
    from weirflow.job.start_position import start_offset

    ssp = SystemStreamPartition("k", "views", 0)
    with pytest.raises(ConfigError, match=r"streams.views.start.*system 'k' cannot start a stream at a time"):
        start_offset(_config(start="2026-11-20T08:00:00Z"), "views", _NoTimeAdmin(()), ssp)


def test_start_offset_on_the_embedded_log(tmp_path) -> None:
    from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
    from weirflow.job.start_position import start_offset
    from weirflow.job.systems import Systems

    config = Config.from_dict({"job": {"name": "j", "state": {"dir": str(tmp_path)}}}, base_dir=tmp_path)
    systems = Systems(config)
    try:
        admin = systems.admin("local")
        admin.create_stream(StreamSpec("views", 1))
        systems.producer("local").send([OutgoingRecord("views", b"x", partition=0) for _ in range(3)])
        ssp = SystemStreamPartition("local", "views", 0)
        assert start_offset(_config(), "views", admin, ssp) == "0"
        assert start_offset(_config(start="latest"), "views", admin, ssp) == "3"
        assert start_offset(_config(start="2000-01-01T00:00:00Z"), "views", admin, ssp) == "0"
        assert start_offset(_config(start="2999-01-01T00:00:00Z"), "views", admin, ssp) == "3"
    finally:
        systems.close()


def test_sdk_checkpoint_is_a_start_keyword_and_a_system_without_them_is_a_config_error(tmp_path) -> None:
    from weirflow.interfaces.system import SystemStreamPartition
    from weirflow.job.start_position import start_offset
    from weirflow.job.systems import Systems

    assert parse_start(_config(start="SDK-checkpoint"), "views") == "sdk-checkpoint"
    config = Config.from_dict({"job": {"name": "j", "state": {"dir": str(tmp_path)}}}, base_dir=tmp_path)
    systems = Systems(config)
    try:
        with pytest.raises(ConfigError, match=r"streams.views.start.*cannot start at an SDK checkpoint"):
            start_offset(
                _config(start="sdk-checkpoint"),
                "views",
                systems.admin("local"),
                SystemStreamPartition("local", "views", 0),
            )
    finally:
        systems.close()


def test_the_event_hubs_checkpoint_layout_is_table_blob_both_or_none() -> None:
    from weirflow_azure.checkpoint.eventhubs_layout import layouts_of

    def layouts(value: object) -> frozenset[str]:
        settings = {"job.name": "j", "task.checkpoint.azure.eventhubs.layout": value}
        return layouts_of(Config.from_dict(settings, source="job.yaml"))

    assert layouts_of(Config.from_dict({"job.name": "j"})) == {"table", "blob"}  # the default: both
    assert layouts("blob") == {"blob"} and layouts("Table") == {"table"} and layouts("none") == set()
    assert layouts(True) == {"table", "blob"} and layouts(False) == set()  # its values when it was a switch
    with pytest.raises(ConfigError, match=r"task.checkpoint.azure.eventhubs.layout' in job.yaml: 'blobs' is not"):
        layouts("blobs")
