"""The job-coordination protocol, written once against the interfaces in `weirflow.interfaces`."""
