"""The keys of the embedded default (`local`), registered like any plugin's: the ``local`` entry point of
``weirflow.config_keys`` (pyproject.toml) points here."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

SECTION = "Embedded default (`local`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "systems.<name>.path",
        "str",
        None,
        "SQLite file holding the system's streams; default `<job.state.dir>/<name>.streams.db`. Jobs sharing "
        "the file share the streams.",
        SECTION,
        system="local",
    ),
    ConfigKey(
        "local.db.busy.timeout.ms",
        "duration_ms",
        10000,
        "How long an embedded-database statement waits for another process's write lock.",
        SECTION,
    ),
)
