"""Network endpoints of a running job (docs/endpoints.md): an HTTP server in every processor."""
