"""docs/configuration.md is generated from the key registry and must not drift from it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from weirflow.config.keys import KEYS, ConfigKey
from weirflow.config.reference import render_markdown
from weirflow.config.registry import plugin_keys, registered_keys
from weirflow.interfaces.config import CONFIG_KEYS_GROUP

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_equals_the_generated_one() -> None:
    assert DOC.read_text() == render_markdown(), "docs/configuration.md is stale: run `make docs`"


def test_every_key_is_documented() -> None:
    text = DOC.read_text()
    missing = [k.name for k in registered_keys() if f"`{k.name}`" not in text]
    assert missing == []


def test_the_check_command_passes_on_the_committed_file() -> None:
    result = subprocess.run([sys.executable, "-m", "weirflow.config.reference", "--check", str(DOC)])
    assert result.returncode == 0


def test_every_installed_plugin_s_keys_are_registered_and_rendered_in_the_one_reference() -> None:
    text = render_markdown()
    plugins = {ep.name: list(ep.load()) for ep in entry_points(group=CONFIG_KEYS_GROUP)}
    assert {"local", "azure", "azure-table", "eventhub"} <= set(plugins)
    for alias, keys in plugins.items():
        assert keys, alias
        for key in keys:
            assert key in registered_keys(), (alias, key.name)
            assert f"| `{key.name}` | {key.type} |" in text, (alias, key.name)
    assert "## Event Hubs systems (`eventhub`)" in text
    assert "| `systems.<name>.prefetch` | int | `20` | Only for systems whose factory is `eventhub`." in text
    # Core declares no plugin's key: the plugins do.
    core = {k.name for k in KEYS}
    assert not core & {"systems.<name>.prefetch", "azure.storage.account", "local.db.busy.timeout.ms"}


FAKE_KEYS = (
    ConfigKey(
        "systems.<name>.shard.count", "int", 4, "Shards a fake stream gets.", "Fake (`fake`)", system="fake"
    ),
    ConfigKey("fake.endpoint", "str", None, "Where the fake service listens.", "Fake (`fake`)"),
)


def test_a_third_party_plugin_registers_its_keys_through_the_entry_point_group() -> None:
    fake = EntryPoint("fake", f"{__name__}:FAKE_KEYS", CONFIG_KEYS_GROUP)
    callable_fake = EntryPoint("fake2", f"{__name__}:_fake_keys", CONFIG_KEYS_GROUP)
    broken = EntryPoint("broken", "no_such_module_anywhere:KEYS", CONFIG_KEYS_GROUP)
    found = plugin_keys([broken, fake, callable_fake])
    assert found == FAKE_KEYS + (_fake_keys()[0],)
    text = render_markdown(KEYS + found)
    assert "## Fake (`fake`)" in text
    assert "| `systems.<name>.shard.count` | int | `4` | Only for systems whose factory is `fake`." in text
    assert "| `fake.endpoint` | str | — | Where the fake service listens. |" in text


def _fake_keys() -> list[ConfigKey]:
    return [ConfigKey("fake.two", "bool", False, "A key declared by a callable.", "Fake (`fake`)")]
