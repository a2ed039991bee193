"""What a job is, independent of who runs it: its model, mode, context, systems, grouping, runs, retention,
start positions, drain notices and the user code it loads (docs/architecture.md)."""
