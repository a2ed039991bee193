#!/usr/bin/env bash
# Upgrade a deployed job (docs/deploy.md, "Upgrading"): drain the running revision with `weirflow upgrade`,
# which also records the next run, then deploy the new image and job config as a new revision.
#
#   infra/upgrade.sh <resource group> <bicepparam file> <current job config> <new job config> <new image>
#
#   e.g. infra/upgrade.sh weirflow-demo infra/pageviews.bicepparam \
#          examples/pageviews/deploy.yaml v2/deploy.yaml <registry>.azurecr.io/weirflow-pageviews:2
#
# Run it where `az login` is done and weirflow is installed (`make install`, or the image itself). You sign in to
# the storage account as yourself (DefaultAzureCredential): you need Storage Blob Data Contributor and Storage
# Table Data Contributor on it, as the processors have. The environment variables the bicepparam file reads
# (WEIRFLOW_ENDPOINTS_TOKEN, WEIRFLOW_REGISTRY, ...) must be set as for the first deployment.
#
# Between the drain and the new revision, Container Apps restarts the drained replicas; each sees that its
# deployment was superseded and exits 0 at once without running anything (docs/drain.md, "Run ids").
set -euo pipefail

if [ "$#" -ne 5 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
group=$1 params=$2 current=$3 new=$4 image=$5
timeout=${WEIRFLOW_DRAIN_TIMEOUT:-600}

# The storage account and namespace of the last deployment of infra/main.bicep in the group.
outputs() {
  az deployment group show -g "$group" -n main --query "properties.outputs.$1.value" -o tsv
}
WEIRFLOW_STORAGE_ACCOUNT=$(outputs storageAccount)
WEIRFLOW_EVENTHUBS_NAMESPACE=$(outputs eventHubsNamespace)
export WEIRFLOW_STORAGE_ACCOUNT WEIRFLOW_EVENTHUBS_NAMESPACE
echo "upgrading the job in storage account $WEIRFLOW_STORAGE_ACCOUNT ($WEIRFLOW_EVENTHUBS_NAMESPACE)" >&2

# 1. Drain the running revision, wait until every task drained and every replica exited, record the next run.
weirflow upgrade "$current" "$new" --no-run --timeout "$timeout"

# 2. The new revision: the new image and job config (its replicas join the run recorded above).
az deployment group create -g "$group" -n main -f "$(dirname "$0")/main.bicep" \
  -p "$params" -p image="$image" -p jobConfig="$(cat "$new")"
