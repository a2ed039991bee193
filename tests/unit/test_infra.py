"""infra/ checked where there is no Azure account and no Bicep CLI (docs/deploy.md, "What is verified").

* every ``resource`` in infra/ names a type and an API version that the Azure management SDK of its provider
  knows: the version is one the package was generated for, and the type is a resource path of that version's
  operations (``.../providers/Microsoft.Storage/storageAccounts/{name}/blobServices/{name}``);
* every role granted is an Azure built-in role, the least the processors need;
* every setting the container app passes is a weirflow config key (``--set key=value``) or an environment
  variable the job config or weirflow reads, and every variable the config reads is passed;
* the example's hubs are the streams its job config declares, with their partition counts;
* the image installs with the Makefile's own steps and copies every package of the distribution;
* with a ``bicep`` executable on PATH, ``bicep build`` and ``bicep lint`` pass (skipped, saying so, otherwise).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path

import pytest

from weirflow.config import load_config
from weirflow.config.loader import known_key
from weirflow.deploy import hubs_to_create
from weirflow.spark.session import build_spark_session

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
BICEP_FILES = sorted(INFRA.rglob("*.bicep"))

RESOURCE = re.compile(r"^\s*resource\s+\w+\s+'(?P<type>[^'@]+)@(?P<version>[^']+)'", re.M)
# Which management SDK describes which resource provider (all dev dependencies, pinned in pyproject.toml).
SDK_OF_PROVIDER = {
    "Microsoft.Storage": "azure.mgmt.storage",
    "Microsoft.EventHub": "azure.mgmt.eventhub",
    "Microsoft.App": "azure.mgmt.appcontainers",
    "Microsoft.Authorization": "azure.mgmt.authorization",
    "Microsoft.OperationalInsights": "azure.mgmt.loganalytics",
    "Microsoft.ManagedIdentity": "azure.mgmt.msi",
}
# Azure's built-in role definition ids (learn.microsoft.com/azure/role-based-access-control/built-in-roles).
BUILT_IN_ROLES = {
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "f526a384-b230-433a-b45c-95f59c4a2dec": "Azure Event Hubs Data Owner",
    "2b629674-e913-4c01-ae53-ef4638d8f975": "Azure Event Hubs Data Sender",
    "a638d3c7-ab3a-418d-83e6-5f17a39d4fde": "Azure Event Hubs Data Receiver",
}
# Variables read by libraries weirflow signs in with, not by the job config.
LIBRARY_VARIABLES = {"AZURE_CLIENT_ID": "azure-identity: the user-assigned identity DefaultAzureCredential uses"}

_API_VERSION = re.compile(r'kwargs\.pop\(\s*"api_version",\s*"(?P<version>[^"]+)"')
_URL = re.compile(r'"(/(?:subscriptions|\{scope\})/[^"]*)"')


@cache
def sdk_versions(package: str) -> dict[str, Path]:
    """API version -> the folder of the package generated for it (the root, or ``v2022_04_01/``)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin, f"{package} is not installed (a dev dependency: make test has it)"
    root = Path(spec.origin).parent
    versions = {}
    for config in root.rglob("_configuration.py"):
        if "aio" in config.parts:
            continue
        match = _API_VERSION.search(config.read_text())
        if match and (config.parent / "operations").is_dir():
            versions[match["version"]] = config.parent
    return versions


@cache
def resource_types(folder: Path) -> frozenset[str]:
    """Resource types (``Microsoft.Storage/storageAccounts/blobServices``, lowercased) of the URL templates of
    the operations in ``folder``: the path after ``providers/<namespace>/`` alternates type and name."""
    types = set()
    for module in (folder / "operations").glob("*.py"):
        for url in _URL.findall(module.read_text()):
            head, sep, tail = url.partition("/providers/")
            if not sep:
                continue
            segments = tail.split("/")
            namespace, rest = segments[0], segments[1:]
            if not rest or len(rest) % 2:
                continue
            types.add("/".join([namespace, *rest[0::2]]).lower())
    return frozenset(types)


def declared_resources() -> list[tuple[str, str, str]]:
    found = []
    for path in BICEP_FILES:
        for match in RESOURCE.finditer(path.read_text()):
            found.append((path.relative_to(ROOT).as_posix(), match["type"], match["version"]))
    return found


def test_every_resource_type_and_api_version_is_one_the_azure_management_sdks_know() -> None:
    resources = declared_resources()
    types = {t for _, t, _ in resources}
    assert {
        "Microsoft.Storage/storageAccounts",
        "Microsoft.Storage/storageAccounts/blobServices/containers",
        "Microsoft.EventHub/namespaces/eventhubs",
        "Microsoft.EventHub/namespaces/eventhubs/consumergroups",
        "Microsoft.OperationalInsights/workspaces",
        "Microsoft.App/managedEnvironments",
        "Microsoft.App/containerApps",
        "Microsoft.ManagedIdentity/userAssignedIdentities",
        "Microsoft.Authorization/roleAssignments",
    } <= types, f"infra/ declares {sorted(types)}"
    wrong = []
    for where, rtype, version in resources:
        provider = rtype.split("/")[0]
        package = SDK_OF_PROVIDER.get(provider)
        if package is None:
            wrong.append(f"{where}: {rtype}: no management SDK mapped for {provider}")
            continue
        versions = sdk_versions(package)
        if version not in versions:
            wrong.append(f"{where}: {rtype}@{version}: {package} knows {sorted(versions)}")
        elif rtype.lower() not in resource_types(versions[version]):
            wrong.append(f"{where}: {rtype}@{version}: no such resource type in {package} ({version})")
    assert not wrong, "\n".join(wrong)


def test_a_wrong_type_or_version_would_be_caught() -> None:
    """The checker itself: it knows a real path and refuses a misspelt one and an unknown version."""
    versions = sdk_versions("azure.mgmt.eventhub")
    (version,) = [v for _, t, v in declared_resources() if t == "Microsoft.EventHub/namespaces"][:1]
    assert "microsoft.eventhub/namespaces/eventhubs/consumergroups" in resource_types(versions[version])
    assert "microsoft.eventhub/namespaces/eventhub" not in resource_types(versions[version])
    assert "2019-13-01" not in versions


def test_roles_are_built_in_and_the_least_the_processors_need() -> None:
    text = (INFRA / "modules" / "roles.bicep").read_text()
    ids = re.findall(r"'([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'", text)
    unknown = [i for i in ids if i not in BUILT_IN_ROLES]
    assert not unknown, f"not built-in role ids: {unknown}"
    assert {BUILT_IN_ROLES[i] for i in ids} == set(BUILT_IN_ROLES.values())
    least = r"createsHubs \? \[eventHubsDataOwner\] : \[eventHubsDataSender, eventHubsDataReceiver\]"
    assert re.search(least, text), "Data Owner only when the job creates hubs"
    for path in BICEP_FILES:  # nothing else grants a role
        if path.name != "roles.bicep":
            assert "roleAssignments" not in path.read_text(), path


def _app_settings() -> tuple[list[str], list[str]]:
    text = (INFRA / "modules" / "app.bicep").read_text()
    args = re.search(r"args: \[(?P<body>.*?)\n\s*\]", text, re.S)
    assert args is not None
    values = re.findall(r"'([^']*)'", args["body"])
    overrides = [values[i + 1] for i, v in enumerate(values) if v == "--set"]
    env = re.findall(r"name: '([A-Z_][A-Z0-9_]*)'", text)
    return overrides, env


def test_every_setting_the_container_app_passes_is_read_by_weirflow() -> None:
    overrides, env = _app_settings()
    assert overrides and env
    for item in overrides:
        key = item.split("=", 1)[0].replace("${eventHubsSystem}", "eh")
        assert known_key(key) is not None, f"--set {key}: not a weirflow config key"
    config_text = (ROOT / "examples" / "pageviews" / "deploy.yaml").read_text()
    read_by_config = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", config_text))
    for name in env:
        assert name in read_by_config or name in LIBRARY_VARIABLES, f"nothing reads {name}"
    assert read_by_config <= set(env), f"the config reads {read_by_config - set(env)}, which the app does not set"


def test_the_deploy_config_loads_with_the_app_s_settings(monkeypatch) -> None:
    overrides, env = _app_settings()
    for name in env:
        monkeypatch.setenv(name, "placeholder")
    resolved = [
        o.replace("${eventHubsSystem}", "eh")
        .replace("${consumerGroup}", "weirflow")
        .replace("${checkpointContainer}", "eventhubs-checkpoints")
        for o in overrides
    ]
    config = load_config(ROOT / "examples" / "pageviews" / "deploy.yaml", resolved)
    assert config.get("job.coordinator.factory") == "azure"
    assert config.get("azure.storage.account") == "placeholder"
    assert not config.get("azure.storage.connection.string")
    assert config.get("systems.eh.fully.qualified.namespace") == "placeholder"
    assert not config.get("systems.eh.connection.string")


def test_the_example_s_hubs_are_the_streams_its_config_declares(monkeypatch) -> None:
    for name in ("WEIRFLOW_STORAGE_ACCOUNT", "WEIRFLOW_EVENTHUBS_NAMESPACE"):
        monkeypatch.setenv(name, "placeholder")
    config = load_config(ROOT / "examples" / "pageviews" / "deploy.yaml")
    text = (INFRA / "pageviews.bicepparam").read_text()
    declared = {(n, int(p)) for n, p in re.findall(r"\{ name: '([^']+)', partitions: (\d+) \}", text)}
    spark = build_spark_session(config)  # the pipeline's code builds Spark columns
    try:
        needed = {(h.name, h.partitions) for h in hubs_to_create(config, "eh")}
    finally:
        spark.stop()
    assert ("pageviews-1-views-by-page", 4) in needed and ("page-views.dlq", 4) in needed
    assert declared == needed


def test_the_image_installs_with_the_makefile_s_steps_and_copies_every_package(tmp_path: Path) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    install = re.search(r"RUN make install (?P<vars>[^\\\n]*)", dockerfile)
    assert install is not None, "the image must install with `make install`"
    plan = subprocess.run(
        ["make", "-n", "-B", "install", *install["vars"].split()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pip install --quiet  '.[azure]'" in plan or "pip install --quiet '.[azure]'" in plan, plan
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {"weirflow", *project["tool"]["setuptools"]["package-dir"].values()}
    copied = set(re.findall(r"^COPY (\S+) \./\1$", dockerfile, re.M))
    assert folders <= copied, f"the image does not copy {folders - copied}"
    assert re.search(r"^USER weirflow$", dockerfile, re.M) and 'ENTRYPOINT ["weirflow"]' in dockerfile


@pytest.mark.skipif(shutil.which("bicep") is None, reason="no bicep executable on PATH: build and lint not run")
def test_bicep_builds_and_lints(tmp_path: Path) -> None:
    params = str(INFRA / "pageviews.bicepparam")
    for command in (
        ["build", str(INFRA / "main.bicep"), "--outdir", str(tmp_path)],
        ["lint", str(INFRA / "main.bicep")],
        ["build-params", params, "--outfile", str(tmp_path / "p.json")],
    ):
        done = subprocess.run(["bicep", *command], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
