"""weirflow as a user installs it: the sdist and wheel built from the checkout (`make dist` builds the same two
files), checked as PyPI reads them, the wheel installed into a fresh venv, and its `weirflow` command run there.

The build is `python -m build --no-isolation`: no network, the project venv's own setuptools (the dev extra
holds the [build-system] floor). It builds the sdist and then the wheel from the unpacked sdist, as `make dist`
and pip do, so a file the sdist leaves out is missing from the wheel too and the checks below see it.

The fresh venv gets the wheel alone (`--no-deps`): installing its dependencies would download PySpark (400 MB)
and the plugins' SDKs. It reads them from the project venv instead, through a `.pth` file holding that venv's
site-packages path. A plain path line in a `.pth` is appended to `sys.path` after the fresh site-packages, and
the `.pth` files of the directory it names are not processed: the project venv's editable install of the
checkout (an import hook its own `.pth` starts) never runs, so `weirflow` and the plugin packages can only come
from the wheel. `test_the_installed_wheel_runs_the_cli` checks that through their `__file__`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from weirflow.base.version import __version__
from weirflow.config.reference import render_markdown

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
INSTALLED_TOPS = sorted({package.split(".")[0] for package in SETUPTOOLS["packages"]})


def _run(command: list[str | Path], cwd: Path = Path("/")) -> subprocess.CompletedProcess[str]:
    """``command`` outside the checkout, without a PYTHONPATH that could put the checkout back on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built sdist and wheel, in a directory of their own."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT])
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("weirflow-*.whl")
    return found


def _folder(package: str) -> Path:
    """The checkout folder of an installed package name, through `package-dir`."""
    for name, directory in SETUPTOOLS.get("package-dir", {}).items():
        if package == name or package.startswith(name + "."):
            return ROOT / directory / package[len(name) :].lstrip(".").replace(".", "/")
    return ROOT / package.replace(".", "/")


def test_the_wheel_holds_every_package_and_file_under_its_installed_name(wheel: Path) -> None:
    """Every package of pyproject's list, and every file of its folder (modules and any data a module opens),
    under the name it is imported by: `weirflow_azure/checkpoint/...`, never `checkpoint/...`."""
    assert wheel.name == f"weirflow-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for package in SETUPTOOLS["packages"]:
        installed, folder = package.replace(".", "/"), _folder(package)
        assert folder.is_dir(), (package, folder)
        if f"{installed}/__init__.py" not in names:
            missing.append(f"{installed}/__init__.py")
        for file in sorted(folder.iterdir()):
            if file.is_file() and not file.name.startswith(".") and file.suffix != ".pyc":
                if f"{installed}/{file.name}" not in names:
                    missing.append(f"{installed}/{file.name} (from {file.relative_to(ROOT)})")
    assert not missing, "not in the wheel (pyproject's packages / package-data): " + ", ".join(missing)
    tops = sorted({name.split("/")[0] for name in names if not name.startswith(f"weirflow-{__version__}.dist")})
    assert tops == INSTALLED_TOPS


def test_the_wheel_metadata_has_the_readme_license_extras_and_command(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    info = f"weirflow-{__version__}.dist-info"
    metadata = HeaderParser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == PYPROJECT["project"]["license"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert str(metadata.get_payload()).strip() == (ROOT / "README.md").read_text().strip()
    assert sorted(metadata.get_all("Provides-Extra", [])) == sorted(PYPROJECT["project"]["optional-dependencies"])
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "weirflow = weirflow.cli:main" in entry_points


def test_twine_check_passes_on_the_sdist_and_wheel(dist: Path) -> None:
    files = sorted(dist.iterdir())
    assert [f.name for f in files] == [
        f"weirflow-{__version__}-py3-none-any.whl",
        f"weirflow-{__version__}.tar.gz",
    ]
    _run([sys.executable, "-m", "twine", "check", "--strict", *files])


def test_the_installed_wheel_runs_the_cli(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    _run([uv, "pip", "install", "--quiet", "--offline", "--python", python, "--no-deps", wheel])
    fresh_site = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    (fresh_site / "weirflow-project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = textwrap.dedent(
        f"""\
        import importlib, json
        print(json.dumps([importlib.import_module(name).__file__ for name in {SETUPTOOLS["packages"]!r}]))
        """
    )
    for file in json.loads(_run([python, "-c", probe], cwd=tmp_path).stdout):
        assert Path(file).is_relative_to(fresh_site), f"{file} is not the installed wheel's"

    weirflow = venv / "bin" / "weirflow"
    assert _run([weirflow, "--version"]).stdout == f"weirflow {__version__}\n"
    assert "--version" in _run([weirflow, "--help"]).stdout
    reference = _run([weirflow, "config-reference"]).stdout
    assert "`job.coordinator.factory`" in reference
    assert reference == render_markdown(), "every plugin's keys, loaded from the wheel"
