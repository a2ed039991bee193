// The least roles the processors need, granted to their managed identity on the two resources they use:
//   Storage Blob Data Contributor  - lease blobs, job model, Spark state, Event Hubs checkpoint blobs
//   Storage Table Data Contributor - processor liveness, latches, checkpoints
//   Azure Event Hubs Data Sender + Receiver - reading inputs and intermediate streams, writing outputs
//   (Azure Event Hubs Data Owner instead, only when the job creates hubs itself: `createsHubs`)
// Ids are Azure's built-in role definition ids (docs/deploy.md lists them with their names).

param principalId string
param storageAccountName string
param eventHubsNamespaceName string
param createsHubs bool = false

var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var eventHubsDataOwner = 'f526a384-b230-433a-b45c-95f59c4a2dec'
var eventHubsDataSender = '2b629674-e913-4c01-ae53-ef4638d8f975'
var eventHubsDataReceiver = 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde'

var storageRoles = [storageBlobDataContributor, storageTableDataContributor]
var eventHubsRoles = createsHubs ? [eventHubsDataOwner] : [eventHubsDataSender, eventHubsDataReceiver]

resource account 'Microsoft.Storage/storageAccounts@2026-09-01' existing = {
  name: storageAccountName
}

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' existing = {
  name: eventHubsNamespaceName
}

resource onStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for role in storageRoles: {
    name: guid(account.id, principalId, role)
    scope: account
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    }
  }
]

resource onEventHubs 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for role in eventHubsRoles: {
    name: guid(namespace.id, principalId, role)
    scope: namespace
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    }
  }
]
