// The job's storage account: lease blobs, the job model, Spark state and Event Hubs checkpoint blobs (Blob
// Storage), processor liveness, latches and checkpoints (Table Storage). Shared-key access is off: every
// client signs in with Entra ID (the container app's managed identity).

@description('Storage account name: 3-24 lowercase letters and digits, unique in Azure.')
param name string
param location string
param tags object = {}

@description('Container of the Event Hubs checkpoint blobs in the SDKs\' layout, which SDK consumers and KEDA read.')
param checkpointContainer string

resource account 'Microsoft.Storage/storageAccounts@2026-09-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    defaultToOAuthAuthentication: true
  }
}

resource blobs 'Microsoft.Storage/storageAccounts/blobServices@2026-09-01' = {
  parent: account
  name: 'default'
}

resource checkpoints 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' = {
  parent: blobs
  name: checkpointContainer
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices@2026-09-01' = {
  parent: account
  name: 'default'
}

output id string = account.id
output name string = account.name
