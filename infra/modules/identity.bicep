// The processors' identity: one user-assigned managed identity, so its roles exist before the first replica
// starts (a system-assigned one would be created with the app, and the first replicas would start unauthorised).

param name string
param location string
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2024-11-30' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output principalId string = identity.properties.principalId
output clientId string = identity.properties.clientId
