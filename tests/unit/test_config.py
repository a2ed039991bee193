"""Config loading: formats, interpolation, overrides, typed values, and errors that name key and file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from weirflow.config import Config, ConfigError, load_config
from weirflow.config.loader import parse_properties


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_nested_and_dotted_yaml_flatten_to_the_same_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "job.yaml",
        """
        job:
          name: views
          coordinator:
            factory: local
            lease.duration.ms: 9000
        systems.local.path: /tmp/x.db
        task: {inputs: [a, b]}
        """,
    )
    cfg = load_config(path)
    assert cfg.get("job.name") == "views"
    assert cfg.get("job.coordinator.factory") == "local"
    assert cfg.get("job.coordinator.lease.duration.ms") == 9000
    assert cfg.get("systems.local.path") == "/tmp/x.db"
    assert cfg.get("task.inputs") == ["a", "b"]
    assert cfg.source_of("job.name") == str(path)


def test_properties_files_with_comments_separators_and_continuations(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "job.properties",
        """
        # a comment
        ! another comment
        job.name=views
        job.id : 7
        task.inputs a, \\
            b
        job.debounce.time.ms=3s
        """,
    )
    cfg = load_config(path)
    assert cfg.get("job.name") == "views"
    assert cfg.get("job.id") == "7"
    assert cfg.get("task.inputs") == ["a", "b"]
    assert cfg.get("job.debounce.time.ms") == 3000
    assert parse_properties("k=v=w\n") == {"k": "v=w"}


def test_unknown_extension_and_missing_file_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\.yaml, \.yml or \.properties"):
        load_config(write(tmp_path, "job.toml", "x = 1"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_environment_variables_are_interpolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOB_NAME", "from-env")
    path = write(tmp_path, "job.yaml", "job: {name: '${JOB_NAME}', id: '${JOB_ID:-blue}'}\n")
    cfg = load_config(path)
    assert cfg.get("job.name") == "from-env"
    assert cfg.get("job.id") == "blue"


def test_a_missing_environment_variable_names_the_key_the_file_and_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    path = write(tmp_path, "job.yaml", "job: {name: x, id: '${NOPE_NOT_SET}'}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "job.id" in message and str(path) in message and "NOPE_NOT_SET" in message


def test_overrides_win_and_report_their_source(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "job: {name: x, debounce.time.ms: 100}\n")
    cfg = load_config(path, ["job.debounce.time.ms=2s", "job.id=9"])
    assert cfg.get("job.debounce.time.ms") == 2000
    assert cfg.source_of("job.debounce.time.ms") == "--set"
    assert cfg.get("job.id") == "9"
    with pytest.raises(ConfigError, match="key=value"):
        load_config(path, ["no-equals-sign"])


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("task.poll.max.records", "250", 250),
        ("task.inputs", "a, b ,,c", ["a", "b", "c"]),
        ("job.debounce.time.ms", "500ms", 500),
        ("job.debounce.time.ms", "2m", 120_000),
        ("job.debounce.time.ms", "1h", 3_600_000),
        ("job.debounce.time.ms", "1500", 1500),
    ],
)
def test_values_convert_to_their_declared_type(key: str, raw: str, expected: object) -> None:
    assert Config.from_dict({"job.name": "x", key: raw}).get(key) == expected


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("task.poll.max.records", True, "an integer"),
        ("task.poll.max.records", "many", "an integer"),
        ("task.stateless.merge", "maybe", "a boolean"),
        ("job.debounce.time.ms", "5 minutes", "a duration"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_expected_type(key: str, raw: object, expected: str) -> None:
    with pytest.raises(ConfigError, match=f"key '{key}' in <dict>: value {raw!r} is not {expected}"):
        Config.from_dict({"job.name": "x", key: raw})


def test_a_bad_value_fails_at_load_naming_the_key_the_file_and_the_value(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "job: {name: x, debounce.time.ms: soon}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "job.debounce.time.ms" in message and str(path) in message and "'soon'" in message


def test_the_required_job_name_is_reported_with_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "job: {id: x}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "job.name" in str(err.value) and str(path) in str(err.value)


def test_an_unknown_key_warns_with_the_closest_known_key(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "job: {name: x, debounce.time: 5}\nspark.sql.shuffle.partitions: 4\n")
    cfg = load_config(path)
    assert len(cfg.warnings) == 1
    assert "job.debounce.time" in cfg.warnings[0]
    assert "did you mean 'job.debounce.time.ms'" in cfg.warnings[0]
    assert cfg.get("spark.sql.shuffle.partitions") == 4


def test_pattern_keys_are_known_and_typed() -> None:
    cfg = Config.from_dict(
        {
            "job": {"name": "x"},
            "systems": {"eh": {"factory": "local"}},
            "streams": {"page-views": {"partitions": "8"}},
        }
    )
    assert cfg.warnings == []
    assert cfg.get("streams.page-views.partitions") == 8
    assert cfg.get("systems.eh.factory") == "local"
    assert cfg.names("systems") == ["eh"]
    assert cfg.subset("streams.page-views") == {"partitions": "8"}


def test_defaults_apply_when_unset() -> None:
    cfg = Config.from_dict({"job.name": "x"})
    assert cfg.get("job.coordinator.lease.duration.ms") == 15000
    assert cfg.get("job.coordinator.factory") == "local"
    assert cfg.get("processor.id") is None
    assert cfg.effective()["job.debounce.time.ms"] == 2000


def test_masked_hides_secrets_including_keys_inside_connection_strings() -> None:
    cfg = Config.from_dict(
        {
            "job.name": "visible",
            "systems.eh.connection.string": "Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=s3cret",
            "systems.store.endpoint": "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=k3y;",
        }
    )
    masked = cfg.masked()
    assert masked["job.name"] == "visible"
    assert masked["systems.eh.connection.string"] == "****"
    assert "k3y" not in masked["systems.store.endpoint"] and "AccountName=a" in masked["systems.store.endpoint"]


def test_the_state_dir_resolves_against_the_config_files_directory(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    relative = load_config(write(tmp_path / "conf", "job.yaml", "job: {name: x, state.dir: state}\n"))
    assert relative.state_dir() == tmp_path / "conf" / "state"
    absolute = load_config(write(tmp_path, "abs.yaml", f"job: {{name: x, state.dir: {tmp_path / 'elsewhere'}}}\n"))
    assert absolute.state_dir() == tmp_path / "elsewhere"


# --- keys owned by plugins -------------------------------------------------------------------------------
def test_an_event_hubs_key_on_the_local_system_is_rejected_naming_key_file_and_owner(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "job: {name: x}\nsystems: {local: {prefetch: 50}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "systems.local.prefetch" in message and str(path) in message
    assert "eventhub" in message and "'local'" in message
    assert err.value.key == "systems.local.prefetch" and err.value.source == str(path)


def test_an_event_hubs_key_is_rejected_on_a_system_of_another_factory_even_by_override(tmp_path: Path) -> None:
    path = write(
        tmp_path, "job.yaml", "job: {name: x}\nsystems: {eh: {factory: eventhub}, mine: {factory: local}}\n"
    )
    with pytest.raises(ConfigError, match=r"systems\.mine\.consumer\.group.*--set.*eventhub"):
        load_config(path, ["systems.mine.consumer.group=jobs"])


def test_an_event_hubs_key_on_an_event_hubs_system_is_accepted_and_typed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "job.yaml",
        """
        job: {name: x}
        systems:
          eh: {factory: eventhub, prefetch: "50", connection.string: "Endpoint=sb://ns/;SharedAccessKey=k"}
          by-path:
            factory: weirflow_azure.eventhubs.factory:EventHubSystemFactory
            prefetch: 7
        """,
    )
    cfg = load_config(path)
    assert cfg.warnings == []
    assert cfg.get("systems.eh.prefetch") == 50
    assert cfg.get("systems.by-path.prefetch") == 7
    assert cfg.get("systems.eh.consumer.group") == "$Default"


def test_a_local_system_key_on_an_event_hubs_system_is_rejected() -> None:
    # `path` is a key of two system plugins (the embedded log's file, the Delta system's tables): both are named
    refused = r"systems\.eh\.path.*of the delta or local system plugin.*factory 'eventhub'"
    with pytest.raises(ConfigError, match=refused):
        Config.from_dict({"job.name": "x", "systems.eh.factory": "eventhub", "systems.eh.path": "/tmp/x.db"})


def test_a_plugin_key_with_a_typo_warns_with_the_closest_key() -> None:
    cfg = Config.from_dict({"job.name": "x", "systems.eh.factory": "eventhub", "systems.eh.prefech": 5})
    assert len(cfg.warnings) == 1
    assert "did you mean 'systems.eh.prefetch'" in cfg.warnings[0]


def test_the_config_is_the_typed_view_factories_receive() -> None:
    from weirflow.interfaces.config import ConfigView

    assert isinstance(Config.from_dict({"job.name": "x"}), ConfigView)
    assert isinstance(Config.from_snapshot(Config.from_dict({"job.name": "x"}).snapshot()), ConfigView)


# --- deprecated names ------------------------------------------------------------------------------------
def test_task_class_still_works_as_a_deprecated_alias_of_task_function(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from weirflow.job.user_code import load_callable

    (tmp_path / "tasks.py").write_text("def process(record):\n    return [record]\n")
    path = write(tmp_path, "job.yaml", "job: {name: x}\ntask: {class: 'tasks:process'}\n")
    with pytest.warns(DeprecationWarning, match=r"'task\.class'.*use 'task\.function'"):
        cfg = load_config(path)
    assert "task.function" in caplog.text and "deprecated" in caplog.text
    assert any("task.function" in w for w in cfg.warnings)
    assert cfg.get("task.function") == "tasks:process"
    assert cfg.get("task.class") == "tasks:process"
    assert cfg.source_of("task.function") == str(path)
    assert load_callable(cfg, "task.function").__name__ == "process"


def test_task_function_does_not_warn_and_a_conflicting_alias_is_an_error(tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = Config.from_dict({"job.name": "x", "task.function": "m:f"})
    assert cfg.warnings == []
    with pytest.raises(ConfigError, match=r"task\.class.*task\.function"):
        Config.from_dict({"job.name": "x", "task.function": "m:f", "task.class": "m:g"})
