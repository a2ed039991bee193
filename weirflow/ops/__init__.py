"""What operators run and read: the job's status, drain progress, upgrades and deploys. The CLI renders
these and the processor's server serves them as JSON (docs/architecture.md)."""
