// Where the processors' logs go: a Log Analytics workspace the Container Apps environment ships stdout to.

param name string
param location string
param tags object = {}
param retentionDays int = 30

resource workspace 'Microsoft.OperationalInsights/workspaces@2025-07-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionDays
  }
}

output id string = workspace.id
output name string = workspace.name
