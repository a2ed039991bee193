"""How weirflow installs: every package folder is shipped under its import name, the Azure suite under the
`weirflow_azure` namespace (no generic top-level names such as `checkpoint`), development tools only with
their extra, and a job's own modules never hide a plugin (docs/architecture.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _import_name(folder: Path) -> str:
    """The import name a package folder is installed under, through `package-dir`."""
    relative = folder.relative_to(ROOT).as_posix()
    for name, directory in PYPROJECT["tool"]["setuptools"].get("package-dir", {}).items():
        if relative == directory or relative.startswith(directory + "/"):
            return name + relative[len(directory) :].replace("/", ".")
    return relative.replace("/", ".")


# Every folder of the installed packages (pyproject.toml): the one list the unit tests that walk the code use.
PACKAGE_FOLDERS = (
    "weirflow",
    "azure_coordinator",
    "checkpoint",
    "eventhub_system",
    "kinesis_system",
    "aws_coordinator",
    "delta_system",
)
INSTALLED_TOPS = {"weirflow", "weirflow_azure", "weirflow_kinesis", "weirflow_aws", "weirflow_delta"}


def test_every_package_folder_is_installed_under_its_namespaced_name() -> None:
    folders = [init.parent for top in PACKAGE_FOLDERS for init in (ROOT / top).rglob("__init__.py")]
    expected = sorted(_import_name(folder) for folder in folders)
    assert sorted(PYPROJECT["tool"]["setuptools"]["packages"]) == expected
    top_level = {name.split(".")[0] for name in expected}
    assert top_level == INSTALLED_TOPS, top_level


def test_entry_points_name_namespaced_modules() -> None:
    for group, aliases in PYPROJECT["project"]["entry-points"].items():
        for alias, target in aliases.items():
            top = target.split(".")[0]
            assert top in INSTALLED_TOPS, (group, alias, target)


def test_the_emulator_engine_comes_only_with_its_extra() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    proton = [dep for dep in extras["emulator"] if dep.startswith("python-qpid-proton")]
    assert proton, extras["emulator"]
    assert not [dep for dep in extras["azure"] if "proton" in dep]
    core = " ".join(PYPROJECT["project"]["dependencies"])
    for plugin_only in ("azure", "boto3", "proton", "deltalake"):
        assert plugin_only not in core
    assert [dep for dep in extras["delta"] if dep.startswith("deltalake")], extras["delta"]


def test_a_jobs_own_checkpoint_module_neither_hides_nor_is_hidden_by_the_plugin(tmp_path: Path) -> None:
    """The job's directory goes first on sys.path when its code is imported; its `checkpoint.py` must stay the
    job's, and the ``azure-table`` checkpoint plugin resolved afterwards must still be the plugin."""
    (tmp_path / "checkpoint.py").write_text("OWNER = 'the job'\n")
    (tmp_path / "tasks.py").write_text("import checkpoint\n\ndef process(rows):\n    return rows\n")
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(
            """\
            job.name: shadow
            task.function: tasks:process
            job.coordinator.factory: azure
            task.checkpoint.factory: azure-table
            """
        )
    )
    probe = textwrap.dedent(
        f"""\
        import json, sys
        from weirflow.config import load_config
        from weirflow.interfaces.plugins import checkpoint_factory, coordinator_factory
        from weirflow.job.user_code import load_callable
        config = load_config({str(tmp_path / "job.yaml")!r})
        load_callable(config, "task.function")
        factory = checkpoint_factory(config)
        coordinator = coordinator_factory(config)
        print(json.dumps({{
            "user": sys.modules["checkpoint"].OWNER,
            "checkpoint": type(factory).__module__ + "." + type(factory).__name__,
            "coordinator": type(coordinator).__module__,
        }}))
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "user": "the job",
        "checkpoint": "weirflow_azure.checkpoint.factories.TableCheckpointManagerFactory",
        "coordinator": "weirflow_azure.coordinator.factories",
    }


def test_the_emulator_command_says_how_to_install_its_engine_when_it_is_missing() -> None:
    probe = textwrap.dedent(
        """\
        import sys
        sys.modules["proton"] = None  # as on an install without the `emulator` extra
        from weirflow.cli import main
        sys.argv = ["weirflow", "emulator", "eventhubs", "--hub", "views:2", "--port", "0"]
        main()
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "weirflow[emulator]" in done.stderr, done.stderr


def test_mypy_reads_every_plugin_folder_under_its_installed_name() -> None:
    """mypy cannot follow the editable install's import hook, so `make lint` links the plugin folders under the
    names they install as: the Makefile's links and checked packages must follow package-dir."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^(MYPY_LINKS|MYPY_PACKAGES) := (.*)$", makefile, re.MULTILINE))
    links = dict(pair.split("=") for pair in variables["MYPY_LINKS"].split())
    package_dir = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert links == {name.replace(".", "/"): folder for name, folder in package_dir.items()}
    assert sorted(variables["MYPY_PACKAGES"].split()) == sorted(["weirflow", *package_dir])
