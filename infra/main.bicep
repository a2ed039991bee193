// weirflow on Azure: N processors of one job in Azure Container Apps, coordinated through Azure Storage, reading
// and writing Event Hubs, all signed in with one user-assigned managed identity (no connection strings).
//
//   az deployment group create -g <resource group> -f infra/main.bicep -p infra/pageviews.bicepparam
//
// docs/deploy.md says what this creates, what it costs, how to build the image and how to tear it down.

targetScope = 'resourceGroup'

@description('Short name of the deployment; prefixes every resource name.')
@minLength(3)
@maxLength(12)
param name string

param location string = resourceGroup().location

@description('Container image with weirflow and the job\'s code (Dockerfile at the repository root).')
param image string

@description('Registry server of a private image (pulled with the managed identity); empty for a public one.')
param registryServer string = ''

@secure()
@description('The job config (YAML), mounted into every replica at /config/job.yaml.')
param jobConfig string

@description('Every event hub the job reads or writes, with the partition counts of its config: [{ name, partitions }].')
param hubs array

@description('Consumer group the job reads with; created on every hub unless $Default.')
param consumerGroup string = 'weirflow'

@description('Name of the Event Hubs system in the job config (`systems.<name>`).')
param eventHubsSystem string = 'eh'

@description('True only when the job creates hubs itself: grants Azure Event Hubs Data Owner instead of Sender + Receiver.')
param createsHubs bool = false

@minValue(1)
@description('Processors of the job (container app replicas).')
param replicas int = 2
param cpu string = '2.0'
param memory string = '4Gi'

@description('Optional: scale out on this hub\'s unprocessed events (KEDA azure-eventhub scaler); empty keeps `replicas` fixed.')
param lagHub string = ''
param maxReplicas int = replicas

@description('Port of the processors\' HTTP servers (`endpoints.port`), behind the app\'s ingress.')
param endpointsPort int = 8080

@description('Opt in to reach the endpoints from outside the Container Apps environment; by default only its apps can.')
param externalEndpoints bool = false

@secure()
@description('Bearer token every request to the endpoints carries (`endpoints.auth.token`): e.g. `openssl rand -hex 32`. Required unless `endpointsTokenKeyVaultSecretUrl` is set.')
param endpointsToken string = ''

@description('Optional: a Key Vault secret URL holding the token, read with the managed identity (grant it Key Vault Secrets User there).')
param endpointsTokenKeyVaultSecretUrl string = ''

@description('Push every processor\'s metrics to Azure Monitor: an Application Insights component on the workspace, the processors exporting through OpenTelemetry (docs/deploy.md, "Telemetry").')
param exportMetrics bool = false

param tags object = {}

var suffix = uniqueString(resourceGroup().id, name)
var storageName = take(toLower('st${replace(name, '-', '')}${suffix}'), 24)
var checkpointContainer = 'eventhubs-checkpoints'

module storage 'modules/storage.bicep' = {
  name: '${name}-storage'
  params: {
    name: storageName
    location: location
    tags: tags
    checkpointContainer: checkpointContainer
  }
}

module eventhubs 'modules/eventhubs.bicep' = {
  name: '${name}-eventhubs'
  params: {
    name: 'evhns-${name}-${suffix}'
    location: location
    tags: tags
    hubs: hubs
    consumerGroup: consumerGroup
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: '${name}-monitoring'
  params: {
    name: 'log-${name}-${suffix}'
    location: location
    tags: tags
    exportMetrics: exportMetrics
  }
}

module identity 'modules/identity.bicep' = {
  name: '${name}-identity'
  params: {
    name: 'id-${name}-${suffix}'
    location: location
    tags: tags
  }
}

module roles 'modules/roles.bicep' = {
  name: '${name}-roles'
  params: {
    principalId: identity.outputs.principalId
    storageAccountName: storage.outputs.name
    eventHubsNamespaceName: eventhubs.outputs.name
    createsHubs: createsHubs
  }
}

module environment 'modules/environment.bicep' = {
  name: '${name}-environment'
  params: {
    name: 'cae-${name}-${suffix}'
    location: location
    tags: tags
    workspaceName: monitoring.outputs.name
  }
}

module app 'modules/app.bicep' = {
  name: '${name}-app'
  dependsOn: [roles] // replicas start signed in with roles already granted
  params: {
    name: 'ca-${name}'
    location: location
    tags: tags
    environmentId: environment.outputs.id
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    image: image
    registryServer: registryServer
    jobConfig: jobConfig
    storageAccountName: storage.outputs.name
    eventHubsNamespace: eventhubs.outputs.fullyQualifiedNamespace
    consumerGroup: consumerGroup
    eventHubsSystem: eventHubsSystem
    checkpointContainer: checkpointContainer
    replicas: replicas
    cpu: cpu
    memory: memory
    lagHub: lagHub
    maxReplicas: maxReplicas
    insightsConnectionString: monitoring.outputs.insightsConnectionString
    endpointsPort: endpointsPort
    externalEndpoints: externalEndpoints
    endpointsToken: endpointsToken
    endpointsTokenKeyVaultSecretUrl: endpointsTokenKeyVaultSecretUrl
    environmentDefaultDomain: environment.outputs.defaultDomain
  }
}

output storageAccount string = storage.outputs.name
output eventHubsNamespace string = eventhubs.outputs.fullyQualifiedNamespace
output containerApp string = app.outputs.name
output checkpointContainer string = checkpointContainer
output endpoints string = 'https://${app.outputs.fqdn}'
