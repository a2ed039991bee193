// The pageviews example (examples/pageviews) on Azure: two processors, its four event hubs.
//   WEIRFLOW_IMAGE=<registry>/weirflow-pageviews:<tag> WEIRFLOW_ENDPOINTS_TOKEN=$(openssl rand -hex 32) \
//     az deployment group create -g <resource group> -f infra/main.bicep -p infra/pageviews.bicepparam
using 'main.bicep'

param name = 'pageviews'
param image = readEnvironmentVariable('WEIRFLOW_IMAGE', 'weirflow-pageviews:latest')
param registryServer = readEnvironmentVariable('WEIRFLOW_REGISTRY', '')
param jobConfig = loadTextContent('../examples/pageviews/deploy.yaml')

// `weirflow deploy hubs examples/pageviews/deploy.yaml` prints this list from the job config
// (tests/unit/test_infra.py checks that they agree).
param hubs = [
  { name: 'page-views', partitions: 4 }
  { name: 'page-views.dlq', partitions: 4 }
  { name: 'page-counts', partitions: 4 }
  { name: 'pageviews-1-views-by-page', partitions: 4 }
]
param consumerGroup = 'weirflow'
param eventHubsSystem = 'eh'
param replicas = 2
// The endpoints' bearer token (a @secure() parameter, kept as the app's secret), from the deploying shell.
param endpointsToken = readEnvironmentVariable('WEIRFLOW_ENDPOINTS_TOKEN', '')
