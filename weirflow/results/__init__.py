"""Reading a job's results once: the formats of output record ids (`weirflow.results.ids`)."""
