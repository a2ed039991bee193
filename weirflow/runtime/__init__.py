"""What every task's runtime shares, whichever data plane runs it: control messages, fencing, served
tables and fault points (docs/architecture.md)."""
