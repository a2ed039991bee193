# The two commands: `make run` and `make test`. Each installs what it needs first (idempotent).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# What `make install` puts in the venv: the Dockerfile runs the same target with EXTRAS=azure,monitor EDITABLE= (a
# plain install of the Azure extra, in the image's own venv), so the image installs exactly as `make run` does.
EXTRAS ?= dev,azure,emulator,kinesis,aws,delta,monitor
EDITABLE ?= -e
NODE_STAMP := node_modules/.installed-stamp

.PHONY: run test install java node test-tools spark-archive lint docs dist clean

# uv installs the packages (pinned here; pip installs it): the same resolution from PyPI as pip, in half
# the time, which every `make run` and `make test` on a new machine waits for. Two settings halve it again
# (`make install` in a fresh clone: 22 s instead of 45):
# - PySpark comes as a source distribution only, so every install builds its wheel, 400 MB of jars that are
#   zip files already: `--compression=stored` writes them into the wheel as they are (deflating them took 14 s).
# - uv's default link mode, hard links from its cache into the venv, instead of copying (12 s of it): uv copies
#   where the two are on different file systems.
# `--compile-bytecode` writes every installed module's bytecode once (16 s on 2 cores). uv leaves none by default,
# and where PYTHONDONTWRITEBYTECODE is set (as on the project's CI machine) Python never writes it: every process
# compiled its imports from source again, 0.45 s of a processor's imports (0.90 s) and 0.30 s of `weirflow drain`
# (0.62 s), in every processor, command and Spark Python process.
UV_VERSION := 0.13.9
UV_BUILD := --config-settings-package 'pyspark:--build-option=--compression=stored'
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(VENV)/bin/uv || $(PY) -m pip install --quiet 'uv==$(UV_VERSION)'
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) $(EDITABLE) '.[$(EXTRAS)]' $(UV_BUILD)
	@touch $(STAMP)

# A Java runtime is installed through apt only when `java` is missing (PySpark needs it).
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "java not found: installing a JRE with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; }

# Azurite (the Azure Storage emulator the tests run against) comes from npm, pinned in package-lock.json.
node:
	@command -v npm >/dev/null 2>&1 || { \
	  echo "npm not found: installing Node.js with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }

# What only the tests use, from Debian, installed through apt when missing, in one apt run: libfaketime
# (`faketime`) runs processors with skewed clocks in the clock-skew tests; headless Chromium renders the status page
# in tests/integration/test_status_page.py. `make test` runs this beside the venv's install and npm's (apt waits on
# the network and dpkg, not on what those write), so a fresh machine does not wait for them one after another.
TEST_TOOLS := faketime chromium
test-tools:
	@missing="$$(for tool in $(TEST_TOOLS); do command -v $$tool >/dev/null 2>&1 || echo $$tool; done)"; \
	if [ -n "$$missing" ]; then \
	  echo "not found: $$(echo $$missing): installing with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(NODE_STAMP): package.json package-lock.json | node
	npm ci --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

# Bytecode for the project's own packages: an editable install leaves none, and where PYTHONDONTWRITEBYTECODE is
# set (as on the project's CI machine) every Python process Spark starts compiled weirflow from source again.
install: $(STAMP) java
	@$(PY) -m compileall -q -j 0 weirflow azure_coordinator checkpoint eventhub_system kinesis_system aws_coordinator \
	  delta_system >/dev/null

# A class-data-sharing archive of Spark's classes (weirflow/spark/class_archive.py): processors start Spark in
# about half the time. Dumped once per Java runtime and PySpark install.
spark-archive: install
	@$(VENV)/bin/weirflow spark-archive

run: install spark-archive
	$(PY) examples/pageviews/demo.py

# The JRE and npm checks run first (the venv's install and npm need them; apt holds one lock). Then three at once:
# apt installs the test tools, npm installs Azurite, and the venv is installed: the first two wait mostly on the
# network, the last on a core. Spark's class archive (once per venv) is not dumped here: pytest starts the dump in
# the background when it is missing, while its workers collect and run tests that wait
# (tests/support/spark_jvm.py).
test: java node
	@$(MAKE) --no-print-directory -j3 test-tools $(NODE_STAMP) install
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder --durations=25

# mypy checks core and the plugin packages under their installed names. It cannot follow the editable install's
# import hook, so the plugin folders are linked under those names (pyproject.toml's package-dir) in MYPY_PATH,
# the `mypy_path` of [tool.mypy].
MYPY_PATH := $(VENV)/mypy-path
MYPY_LINKS := weirflow_azure/coordinator=azure_coordinator weirflow_azure/checkpoint=checkpoint \
	weirflow_azure/eventhubs=eventhub_system weirflow_kinesis=kinesis_system \
	weirflow_aws=aws_coordinator weirflow_delta=delta_system
MYPY_PACKAGES := weirflow weirflow_azure.coordinator weirflow_azure.checkpoint weirflow_azure.eventhubs weirflow_kinesis weirflow_aws \
	weirflow_delta

# Style, format, types and import layers; `.ci/run` runs it before the tests and fails on any finding.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@rm -rf $(MYPY_PATH)
	@for link in $(MYPY_LINKS); do \
	  mkdir -p $$(dirname $(MYPY_PATH)/$${link%=*}) && ln -s $(CURDIR)/$${link#*=} $(MYPY_PATH)/$${link%=*}; done
	$(VENV)/bin/mypy $(addprefix -p ,$(MYPY_PACKAGES))
	$(VENV)/bin/lint-imports --no-cache --no-logo

docs: install
	$(PY) -m weirflow.config.reference > docs/configuration.md

# What a release publishes, in dist/: the sdist and the one wheel (core and every plugin package, the plugins'
# dependencies behind extras), built as pip builds them (an isolated environment with [build-system]'s setuptools,
# the wheel from the unpacked sdist), then checked as PyPI reads them (metadata, the README as long description).
# dist/ is emptied first, so `twine check` and an upload see this build's files only.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

clean:
	rm -rf $(VENV) node_modules .weirflow examples/*/.weirflow
