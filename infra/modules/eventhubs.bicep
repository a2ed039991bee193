// The Event Hubs namespace with every hub the job reads or writes (inputs, outputs, intermediate streams,
// dead-letter hubs) at the partition counts of the job's config, and the job's consumer group on each.
// Local (SAS) auth is off: clients sign in with Entra ID.

param name string
param location string
param tags object = {}

@description('Hubs to create: [{ name: string, partitions: int }], from the job config (docs/deploy.md).')
param hubs array

@description('Consumer group the job reads with (`systems.<name>.consumer.group`).')
param consumerGroup string

@description('Standard allows consumer groups other than $Default and 7 days of retention.')
param sku string = 'Standard'
param capacity int = 1
param retentionDays int = 1

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: sku
    tier: sku
    capacity: capacity
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
  }
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2026-01-01' = [
  for h in hubs: {
    parent: namespace
    name: h.name
    properties: {
      partitionCount: h.partitions
      messageRetentionInDays: retentionDays
    }
  }
]

resource group 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2026-01-01' = [
  for (h, i) in hubs: if (consumerGroup != '$Default') {
    parent: hub[i]
    name: consumerGroup
  }
]

output id string = namespace.id
output name string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
