// One container app running `weirflow run` in N replicas: N processors of one job, which find each other
// through the Azure coordinator (leases and tables in the storage account) and share the job's tasks.
//
// What reaches the processes:
//   /config/job.yaml          the job config, from the app's secret `job-config` (mounted as a file)
//   WEIRFLOW_STORAGE_ACCOUNT  read by the config as ${WEIRFLOW_STORAGE_ACCOUNT} (azure.storage.account)
//   WEIRFLOW_EVENTHUBS_NAMESPACE  read by the config (systems.<name>.fully.qualified.namespace)
//   AZURE_CLIENT_ID           which managed identity DefaultAzureCredential signs in as (azure-identity)
//   --set arguments           config keys of `weirflow run` (consumer group, state directory)
// No connection string or key is passed: storage and Event Hubs both use Entra ID.
//
// Health probes: a processor has no network endpoint yet, so none are declared; the platform restarts a
// replica whose process exits, and the coordinator moves its tasks (docs/deploy.md).

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
      secrets: [
        {
          name: 'job-config'
          value: jobConfig
        }
      ]
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
          ]
          env: [
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
          ]
          resources: {
            cpu: json(cpu)
            memory: memory
          }
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
