"""infra/ checked where there is no Azure account and no Bicep CLI (docs/deploy.md, "What is verified").

* every ``resource`` in infra/ names a type and an API version that the Azure management SDK of its provider
  knows: the version is one the package was generated for, and the type is a resource path of that version's
  operations (``.../providers/Microsoft.Storage/storageAccounts/{name}/blobServices/{name}``);
* every role granted is an Azure built-in role, the least the processors need;
* every setting the container app passes is a weirflow config key (``--set key=value``) or an environment
  variable the job config or weirflow reads, and every variable the config reads is passed;
* the endpoints (docs/deploy.md, "Endpoints"): an ingress internal unless a bool parameter opts in, three probes
  on ``/healthz`` (which answers without the token) at the endpoint port, the token only ever a ``@secure()``
  parameter kept as a Container Apps secret and passed by ``secretRef``, and the deploy config giving a server
  bound to 0.0.0.0 with a token; the property names are those of the SDK's models of the API version used;
* the example's hubs are the streams its job config declares, with their partition counts;
* the image installs with the Makefile's own steps and copies every package of the distribution;
* with a ``bicep`` executable on PATH, ``bicep build`` and ``bicep lint`` pass (skipped, saying so, otherwise).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from weirflow.base.errors import ConfigError
from weirflow.config import load_config
from weirflow.config.loader import known_key
from weirflow.endpoints.advertise import advertised_url
from weirflow.endpoints.otel_export import export_setting
from weirflow.endpoints.server import HEALTH_PATH, create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.ops.deploy import hubs_to_create
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
    "Microsoft.Insights": "azure.mgmt.applicationinsights",
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
LIBRARY_VARIABLES = {
    "AZURE_CLIENT_ID": "azure-identity: the user-assigned identity DefaultAzureCredential uses",
    "APPLICATIONINSIGHTS_CONNECTION_STRING": "the Azure Monitor exporter (weirflow.endpoints.otel_export)",
}
# Variables Container Apps sets in every replica itself (its docs: "Environment variables", built-in ones).
PLATFORM_VARIABLES = {
    "CONTAINER_APP_REVISION": "the revision's name: app.deployment.id, one deployment per revision"
}
APP = INFRA / "modules" / "app.bicep"
# What the app module's interpolations (``${...}`` in its --set arguments) are with main.bicep's defaults.
APP_DEFAULTS = {
    "eventHubsSystem": "eh",
    "consumerGroup": "weirflow",
    "checkpointContainer": "eventhubs-checkpoints",
    "endpointsPort": "8080",
    "ingressFqdn": "ca-pageviews.internal.happy-sky-1234.westeurope.azurecontainerapps.io",
    "name": "ca-pageviews",
    "metricsExport": "azure-monitor",  # with `insightsConnectionString` (exportMetrics); "none" without
}

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
    text = APP.read_text()
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
    unset = read_by_config - set(env) - set(PLATFORM_VARIABLES)
    assert not unset, f"the config reads {unset}, which neither the app nor the platform sets"
    assert "deployment.id: ${CONTAINER_APP_REVISION" in config_text, "one deployment (run) per revision"


def test_the_deploy_config_loads_with_the_app_s_settings(monkeypatch) -> None:
    overrides, env = _app_settings()
    for name in env:
        monkeypatch.setenv(name, "placeholder")
    resolved = [re.sub(r"\$\{(\w+)\}", lambda m: APP_DEFAULTS[m[1]], o) for o in overrides]
    deploy_yaml = ROOT / "examples" / "pageviews" / "deploy.yaml"
    config = load_config(deploy_yaml, resolved)
    assert config.get("job.coordinator.factory") == "azure"
    assert config.get("azure.storage.account") == "placeholder"
    assert not config.get("azure.storage.connection.string")
    assert config.get("systems.eh.fully.qualified.namespace") == "placeholder"
    assert not config.get("systems.eh.connection.string")
    assert export_setting(config) == "azure-monitor"  # the exporter's extra installed, its connection string set
    # the endpoints: every address of the replica, on the port of the ingress and probes, with the token
    endpoints = EndpointSettings.from_config(config)
    assert (endpoints.host, endpoints.port, endpoints.token) == ("0.0.0.0", 8080, "placeholder")
    assert endpoints.enabled and endpoints.advertised_url is None
    assert endpoints.allowed_hosts == (APP_DEFAULTS["ingressFqdn"], APP_DEFAULTS["name"])
    # what a replica registers for its peers: its own address in the environment's network, not 0.0.0.0
    assert (
        advertised_url(endpoints.host, endpoints.port, None, lambda family: ["10.0.0.7"]) == "http://10.0.0.7:8080"
    )
    # a replica whose secret did not reach it refuses to start rather than serve without a token
    monkeypatch.delenv("WEIRFLOW_ENDPOINTS_TOKEN")
    with pytest.raises(ConfigError, match="endpoints.auth.token"):
        EndpointSettings.from_config(load_config(deploy_yaml, resolved))


# --- the endpoints ------------------------------------------------------------------------------------------


def _closing(text: str, start: int) -> int:
    """The index of the bracket closing the one at ``start``, skipping '...' strings and // comments."""
    depth, i, quoted = 0, start, False
    while i < len(text):
        c = text[i]
        if quoted:
            quoted = c != "'" or text[i - 1] == "\\"
        elif c == "'":
            quoted = True
        elif text.startswith("//", i):
            i = text.index("\n", i)
            continue
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise AssertionError(f"unbalanced bracket at {start}")


def _value(text: str, key: str) -> str:
    """The value of the first ``key:`` in ``text``: an object or array whole, with its brackets, else the line."""
    match = re.search(rf"^\s*{key}: ", text, re.M)
    assert match is not None, f"no {key}: in {text[:200]}"
    start = match.end()
    if text.startswith("filter([", start):  # an array some of whose entries exist only on a condition
        start += len("filter(")
    if text[start] in "{[":
        return text[start : _closing(text, start) + 1]
    return text[start:].split("\n", 1)[0].split(" //")[0].strip()


def _objects(array: str) -> list[str]:
    """The object literals in ``array`` (either branch of a ternary too), outermost first."""
    found, i = [], 1
    while (i := array.find("{", i)) != -1:
        end = _closing(array, i)
        found.append(array[i : end + 1])
        i = end + 1
    return found


def _props(obj: str) -> dict[str, str]:
    """The properties of an object literal (its own, not nested ones'): name -> value as written."""
    body, props, i = obj[1:-1], {}, 0
    for match in re.finditer(r"^[ \t]*(\w+): ", body, re.M):
        if match.start() >= i:
            props[match[1]] = _value(body[match.start() :], match[1])
            i = match.start() + len(match[0]) + len(props[match[1]])
    return props


def _params(text: str) -> dict[str, tuple[str, str]]:
    """Every ``param`` of a Bicep file: name -> (its decorators, its declaration line)."""
    found = {}
    for match in re.finditer(r"((?:^@.*\n)*)^param (\w+) (.*)$", text, re.M):
        found[match[2]] = (match[1], match[3])
    return found


def _models(package: str, rtype: str) -> ModuleType:
    """The SDK's models module of the API version ``rtype`` is declared with in infra/."""
    (version,) = {v for _, t, v in declared_resources() if t == rtype}
    folder = sdk_versions(package)[version]
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin
    parts = folder.relative_to(Path(spec.origin).parent).parts
    return importlib.import_module(".".join([package, *parts, "models"]))


def _wire_names(model: type) -> set[str]:
    """The JSON property names of an SDK model (what Bicep spells): its table of fields, built on first use."""
    model()
    return {field._rest_name for field in model._attr_to_rest_field.values()}


def test_the_endpoints_ingress_is_internal_unless_a_bool_parameter_opts_in() -> None:
    app, main = APP.read_text(), (INFRA / "main.bicep").read_text()
    models = _models("azure.mgmt.appcontainers", "Microsoft.App/containerApps")
    ingress = _props(_value(app, "ingress"))
    assert set(ingress) <= _wire_names(models.Ingress), set(ingress) - _wire_names(models.Ingress)
    assert ingress["external"] == "externalEndpoints"
    for text in (app, main):
        assert _params(text)["externalEndpoints"][1] == "bool = false"
    assert re.search(r"^\s*externalEndpoints: externalEndpoints$", main, re.M), "main.bicep passes the opt-in on"
    assert ingress["targetPort"] == "endpointsPort" and ingress["allowInsecure"] == "false"
    assert ingress["transport"].strip("'") in {t.value for t in models.IngressTransportMethod}
    # the server listens where the ingress sends: every address, on the ingress's target port
    overrides, _ = _app_settings()
    assert {"endpoints.host=0.0.0.0", "endpoints.port=${endpointsPort}"} <= set(overrides)
    assert "endpoints.allowed.hosts=${ingressFqdn},${name}" in overrides  # the Host the ingress forwards


def test_startup_readiness_and_liveness_probes_ask_healthz_on_the_endpoint_port() -> None:
    app = APP.read_text()
    models = _models("azure.mgmt.appcontainers", "Microsoft.App/containerApps")
    probes = [_props(p) for p in _objects(_value(_value(app, "containers"), "probes"))]
    assert sorted(p["type"].strip("'") for p in probes) == ["Liveness", "Readiness", "Startup"]
    assert {p["type"].strip("'") for p in probes} <= {t.value for t in models.Type}
    healthz = re.search(r"^var healthz = (\{.*?^\})", app, re.M | re.S)
    assert healthz is not None
    http_get = _props(healthz[1])
    assert set(http_get) <= _wire_names(models.ContainerAppProbeHttpGet)
    assert http_get["path"] == f"'{HEALTH_PATH}'" and http_get["port"] == "endpointsPort"
    for probe in probes:
        assert set(probe) <= _wire_names(models.ContainerAppProbe), probe
        assert probe["httpGet"] == "healthz", probe
        # the service's limits (the SDK's docstrings): failureThreshold 1-10, periodSeconds 1-240, delay 0-60
        assert 1 <= int(probe["failureThreshold"]) <= 10 and 1 <= int(probe["periodSeconds"]) <= 240
        assert 0 <= int(probe.get("initialDelaySeconds", "0")) <= 60
    (startup,) = [p for p in probes if p["type"] == "'Startup'"]
    budget = int(startup.get("initialDelaySeconds", "0")) + int(startup["periodSeconds"]) * int(
        startup["failureThreshold"]
    )
    assert budget >= 120, f"a replica gets {budget} s to start its Spark session before it is restarted"
    # probes send no Authorization header: /healthz must answer without the token the deployment sets
    settings = EndpointSettings(True, "0.0.0.0", 8080, None, "s3cret")
    probe = TestClient(
        create_app(settings, dict, lambda: (True, "RUNNING"), bytes), base_url="http://10.0.0.7:8080"
    )
    assert probe.get(HEALTH_PATH).status_code == 200 and probe.get("/status").status_code == 401


def test_the_token_reaches_the_container_only_as_a_secret_from_a_secure_parameter() -> None:
    app, main = APP.read_text(), (INFRA / "main.bicep").read_text()
    models = _models("azure.mgmt.appcontainers", "Microsoft.App/containerApps")
    for path in BICEP_FILES:  # no plain parameter carries a secret
        for name, (decorators, _) in _params(path.read_text()).items():
            if re.search(r"(token|password|secret|key|config)$", name, re.I):
                assert "@secure()" in decorators, f"{path.name}: param {name} must be @secure()"
    assert "@secure()" in _params(main)["endpointsToken"][0] and "@secure()" in _params(app)["endpointsToken"][0]
    assert re.search(r"^\s*endpointsToken: endpointsToken$", main, re.M)
    secrets = [_props(o) for o in _objects(_value(app, "secrets"))]
    for secret in secrets:
        assert set(secret) <= _wire_names(models.Secret), secret
    tokens = [s for s in secrets if s["name"] == "'endpoints-token'"]
    assert [t.get("value") for t in tokens] == ["endpointsToken", None], "the value, or a Key Vault reference"
    assert tokens[1]["keyVaultUrl"] == "endpointsTokenKeyVaultSecretUrl" and tokens[1]["identity"] == "identityId"
    # the secret's only way into the container: an environment variable by secretRef
    env = [_props(o) for o in _objects(_value(app, "env"))]
    for variable in env:
        assert set(variable) <= _wire_names(models.EnvironmentVar), variable
    (token_env,) = [v for v in env if v["name"] == "'WEIRFLOW_ENDPOINTS_TOKEN'"]
    assert token_env == {"name": "'WEIRFLOW_ENDPOINTS_TOKEN'", "secretRef": "'endpoints-token'"}
    code = [line.strip() for line in app.splitlines() if not line.lstrip().startswith(("@", "//"))]
    uses = [line for line in code if re.search(r"\bendpointsToken\b", line)]
    assert uses == ["param endpointsToken string = ''", "value: endpointsToken"], uses
    overrides, _ = _app_settings()
    assert not [o for o in overrides if o.startswith("endpoints.auth")], "never in the arguments"
    config_text = (ROOT / "examples" / "pageviews" / "deploy.yaml").read_text()
    assert re.search(r"^\s*auth\.token: \$\{WEIRFLOW_ENDPOINTS_TOKEN:-\}$", config_text, re.M)
    assert re.search(r"^output .*[Tt]oken", main + app, re.M) is None
    bicepparam = (INFRA / "pageviews.bicepparam").read_text()
    assert "param endpointsToken = readEnvironmentVariable('WEIRFLOW_ENDPOINTS_TOKEN', '')" in bicepparam


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
    assert re.search(r"uv pip install --quiet (?:--[a-z-]+ )*--python \S+ +'\.\[azure,monitor\]'", plan), plan
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


def test_the_upgrade_script_drains_before_it_deploys_and_passes_no_secret_on_its_command_line() -> None:
    script = INFRA / "upgrade.sh"
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    drain = text.index("weirflow upgrade")
    deploy = text.index("az deployment group create")
    assert drain < deploy, "the new revision is deployed only after the running one drained"
    assert "--no-run" in text[drain:deploy], "the new processors are the new revision's, not this machine's"
    assert "image=" in text[deploy:] and "jobConfig=" in text[deploy:]
    assert "endpointsToken=" not in text, "the token stays in the environment (the bicepparam reads it)"


def test_metrics_go_to_azure_monitor_only_when_asked_and_their_connection_string_only_as_a_secret() -> None:
    app, main = APP.read_text(), (INFRA / "main.bicep").read_text()
    monitoring = (INFRA / "modules" / "monitoring.bicep").read_text()
    assert re.search(r"^param exportMetrics bool = false$", main, re.M), "off unless the deployment asks"
    assert re.search(r"^\s*exportMetrics: exportMetrics$", main, re.M)
    assert "resource insights 'Microsoft.Insights/components@" in monitoring
    assert "= if (exportMetrics)" in monitoring
    assert "WorkspaceResourceId: workspace.id" in monitoring, "its metrics land beside the logs"
    assert re.search(r"@secure\(\)\noutput insightsConnectionString ", monitoring), "a secure output"
    assert re.search(r"^\s*insightsConnectionString: monitoring\.outputs\.insightsConnectionString$", main, re.M)
    assert "@secure()" in _params(app)["insightsConnectionString"][0]
    assert "var metricsExport = empty(insightsConnectionString) ? 'none' : 'azure-monitor'" in app
    overrides, _ = _app_settings()
    assert "metrics.export=${metricsExport}" in overrides
    secrets = {_props(o)["name"]: _props(o) for o in _objects(_value(app, "secrets"))}
    assert secrets["'appinsights-connection-string'"]["value"] == "insightsConnectionString"
    env = {_props(o)["name"]: _props(o) for o in _objects(_value(app, "env"))}
    assert env["'APPLICATIONINSIGHTS_CONNECTION_STRING'"] == {
        "name": "'APPLICATIONINSIGHTS_CONNECTION_STRING'",
        "secretRef": "'appinsights-connection-string'",
    }
    # both entries exist only while metrics are exported: each array is filtered on the connection string
    condition = "!empty(insightsConnectionString) || !contains(exportOnly, "
    assert app.count(condition) == 2 and "var exportOnly = ['appinsights-connection-string', " in app
