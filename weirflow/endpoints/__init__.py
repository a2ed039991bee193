"""Network endpoints of a running job (issue 16; docs/endpoints.md): an HTTP server in every processor."""
