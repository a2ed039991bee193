// Where the processors' logs go: a Log Analytics workspace the Container Apps environment ships stdout to; and,
// with `exportMetrics`, an Application Insights component on that workspace that the processors push their
// metrics to (`metrics.export: azure-monitor`, OpenTelemetry; docs/deploy.md, "Telemetry"). Its metrics land in
// the workspace's AppMetrics table, beside the logs (ContainerAppConsoleLogs_CL).

param name string
param location string
param tags object = {}
param retentionDays int = 30

@description('Create the Application Insights component the processors export metrics to.')
param exportMetrics bool = false

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

resource insights 'Microsoft.Insights/components@2020-02-02' = if (exportMetrics) {
  name: 'appi-${name}'
  location: location
  tags: tags
  kind: 'other'
  properties: {
    Application_Type: 'other'
    WorkspaceResourceId: workspace.id
    IngestionMode: 'LogAnalytics'
    DisableLocalAuth: false // the exporter signs in with the connection string's key
  }
}

output id string = workspace.id
output name string = workspace.name
@secure()
output insightsConnectionString string = exportMetrics ? insights!.properties.ConnectionString : ''
