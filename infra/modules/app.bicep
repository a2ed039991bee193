// One container app running `weirflow run` in N replicas: N processors of one job, which find each other
// through the Azure coordinator (leases and tables in the storage account) and share the job's tasks.
//
// What reaches the processes:
//   /config/job.yaml          the job config, from the app's secret `job-config` (mounted as a file)
//   WEIRFLOW_STORAGE_ACCOUNT  read by the config as ${WEIRFLOW_STORAGE_ACCOUNT} (azure.storage.account)
//   WEIRFLOW_EVENTHUBS_NAMESPACE  read by the config (systems.<name>.fully.qualified.namespace)
//   AZURE_CLIENT_ID           which managed identity DefaultAzureCredential signs in as (azure-identity)
//   WEIRFLOW_ENDPOINTS_TOKEN  the endpoints' bearer token, from the app's secret `endpoints-token` (a value or a
//                             Key Vault reference), read by the config as ${WEIRFLOW_ENDPOINTS_TOKEN}
//   APPLICATIONINSIGHTS_CONNECTION_STRING  with `insightsConnectionString`: where the processors push their metrics
//                             (secret `appinsights-connection-string`; `--set metrics.export=azure-monitor`)
//   --set arguments           config keys of `weirflow run` (consumer group, state directory, endpoints, metrics)
// No connection string or key is passed: storage and Event Hubs both use Entra ID.
//
// Endpoints (docs/deploy.md, "Endpoints"): every processor serves HTTP on `endpointsPort`, bound to 0.0.0.0.
//   * Peers: each processor registers the replica's own address towards the network (its IP in the
//     environment's network, weirflow/endpoints/advertise.py), and the others forward lookups there. Not the
//     ingress's name, which balances over all replicas and cannot name one; not the replica's host name
//     (CONTAINER_APP_REPLICA_NAME), which no DNS resolves for the other replicas.
//   * Clients: the ingress, internal to the environment unless `externalEndpoints`; it forwards the client's
//     Host header (the app's FQDN) unchanged, so that name is in endpoints.allowed.hosts. Any replica answers
//     any lookup (docs/endpoints.md, "Who answers").
//   * Probes: startup, readiness and liveness on GET /healthz, which needs no token (probes send none).

param name string
param location string
param tags object = {}
param environmentId string
param identityId string
param identityClientId string
param image string

@description('Registry server of a private image, pulled with the managed identity (which needs AcrPull there); empty for a public image.')
param registryServer string = ''

@secure()
@description('The job config (YAML), mounted at /config/job.yaml.')
param jobConfig string

param storageAccountName string
param eventHubsNamespace string
param consumerGroup string

@description('Blob container of the Event Hubs checkpoints in the SDKs\' layout (`task.checkpoint.azure.eventhubs.container`).')
param checkpointContainer string

@description('Name of the Event Hubs system in the job config (`systems.<name>`).')
param eventHubsSystem string = 'eh'

@minValue(1)
param replicas int = 2
param cpu string = '2.0'
param memory string = '4Gi'

@description('Scale between `replicas` and `maxReplicas` on unprocessed events of `lagHub` (KEDA azure-eventhub scaler, reading the Blob checkpoints weirflow writes); off when empty.')
param lagHub string = ''
param maxReplicas int = replicas
param lagThreshold int = 1000

@minValue(1)
@maxValue(65535)
@description('Port of every processor\'s HTTP server (`endpoints.port`): the ingress\'s target, the probes\' port and the port peers forward to.')
param endpointsPort int = 8080

@description('Whether the ingress accepts requests from outside the environment (internet or VNet); false: only apps of the environment reach the endpoints.')
param externalEndpoints bool = false

@secure()
@description('Bearer token of the endpoints (`endpoints.auth.token`), kept as the app\'s secret `endpoints-token`; empty when `endpointsTokenKeyVaultSecretUrl` is set.')
param endpointsToken string = ''

@description('Key Vault secret URL of the token instead (read with the managed identity, which needs Key Vault Secrets User on it); empty: `endpointsToken`.')
param endpointsTokenKeyVaultSecretUrl string = ''

@secure()
@description('Connection string of the Application Insights component the processors push their metrics to (`metrics.export: azure-monitor`); empty: no export.')
param insightsConnectionString string = ''

@description('The environment\'s default domain (`<unique id>.<region>.azurecontainerapps.io`), which the app\'s FQDN ends with.')
param environmentDefaultDomain string

// The name clients put in Host through the ingress: <app>.<domain> when external, <app>.internal.<domain> when
// internal; apps of the environment may also name it by <app> alone.
var ingressFqdn = externalEndpoints ? '${name}.${environmentDefaultDomain}' : '${name}.internal.${environmentDefaultDomain}'
var metricsExport = empty(insightsConnectionString) ? 'none' : 'azure-monitor'
// Entries of `secrets` and `env` that exist only while metrics are exported.
var exportOnly = ['appinsights-connection-string', 'APPLICATIONINSIGHTS_CONNECTION_STRING']
var healthz = {
  path: '/healthz'
  port: endpointsPort
  scheme: 'HTTP'
}

var lagRule = {
  name: 'eventhub-lag'
  custom: {
    type: 'azure-eventhub'
    identity: identityId
    metadata: {
      eventHubNamespace: split(eventHubsNamespace, '.')[0]
      eventHubName: lagHub
      consumerGroup: consumerGroup
      unprocessedEventThreshold: string(lagThreshold)
      storageAccountName: storageAccountName
      blobContainer: checkpointContainer
      checkpointStrategy: 'blobMetadata'
    }
  }
}

resource app 'Microsoft.App/containerApps@2026-07-01' = {
  name: name
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    environmentId: environmentId
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      secrets: filter([
        {
          name: 'job-config'
          value: jobConfig
        }
        empty(endpointsTokenKeyVaultSecretUrl) ? {
          name: 'endpoints-token'
          value: endpointsToken
        } : {
          name: 'endpoints-token'
          keyVaultUrl: endpointsTokenKeyVaultSecretUrl
          identity: identityId
        }
        {
          name: 'appinsights-connection-string'
          value: insightsConnectionString
        }
      ], secret => !empty(insightsConnectionString) || !contains(exportOnly, secret.name))
      ingress: {
        external: externalEndpoints
        targetPort: endpointsPort
        transport: 'http'
        allowInsecure: false // plain HTTP is redirected to HTTPS: the bearer token never crosses the ingress in clear
      }
      registries: empty(registryServer) ? [] : [
        {
          server: registryServer
          identity: identityId
        }
      ]
    }
    template: {
      terminationGracePeriodSeconds: 90
      containers: [
        {
          name: 'processor'
          image: image
          args: [
            'run'
            '/config/job.yaml'
            '--set'
            'systems.${eventHubsSystem}.consumer.group=${consumerGroup}'
            '--set'
            'job.state.dir=/var/lib/weirflow'
            '--set'
            'task.checkpoint.azure.eventhubs.container=${checkpointContainer}'
            '--set'
            'metrics.export=${metricsExport}'
            '--set'
            'endpoints.host=0.0.0.0'
            '--set'
            'endpoints.port=${endpointsPort}'
            '--set'
            'endpoints.allowed.hosts=${ingressFqdn},${name}'
          ]
          env: filter([
            {
              name: 'AZURE_CLIENT_ID'
              value: identityClientId
            }
            {
              name: 'WEIRFLOW_STORAGE_ACCOUNT'
              value: storageAccountName
            }
            {
              name: 'WEIRFLOW_EVENTHUBS_NAMESPACE'
              value: eventHubsNamespace
            }
            {
              name: 'WEIRFLOW_ENDPOINTS_TOKEN'
              secretRef: 'endpoints-token'
            }
            {
              name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
              secretRef: 'appinsights-connection-string'
            }
          ], variable => !empty(insightsConnectionString) || !contains(exportOnly, variable.name))
          resources: {
            cpu: json(cpu)
            memory: memory
          }
          // /healthz answers 200 from the moment the server listens (after the Spark session started) until the
          // processor fails or stops, then 503. Startup allows 30 + 10 x 15 s for the session to come up.
          probes: [
            {
              type: 'Startup'
              httpGet: healthz
              initialDelaySeconds: 30
              periodSeconds: 15
              failureThreshold: 10
              timeoutSeconds: 5
            }
            {
              type: 'Readiness'
              httpGet: healthz
              periodSeconds: 10
              failureThreshold: 3
              timeoutSeconds: 5
            }
            {
              type: 'Liveness'
              httpGet: healthz
              periodSeconds: 20
              failureThreshold: 3
              timeoutSeconds: 5
            }
          ]
          volumeMounts: [
            {
              volumeName: 'config'
              mountPath: '/config'
            }
          ]
        }
      ]
      volumes: [
        {
          name: 'config'
          storageType: 'Secret'
          secrets: [
            {
              secretRef: 'job-config'
              path: 'job.yaml'
            }
          ]
        }
      ]
      scale: {
        minReplicas: replicas
        maxReplicas: empty(lagHub) ? replicas : maxReplicas
        rules: empty(lagHub) ? [] : [lagRule]
      }
    }
  }
}

output name string = app.name
output fqdn string = ingressFqdn
