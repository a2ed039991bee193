"""The shared leaves: errors, the clock, telemetry, malformed-document reports, bounded service calls, the
SQLite helper and waiting for a condition (`wait_until`). They import nothing of weirflow but each other, so a
plugin may use them (docs/architecture.md)."""
