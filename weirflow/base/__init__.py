"""The shared leaves: errors, the clock, telemetry, malformed-document reports, bounded service calls and
the SQLite helper. They import nothing of weirflow but each other, so a plugin may use them
(docs/architecture.md)."""
