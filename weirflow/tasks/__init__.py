"""How a processor runs the tasks assigned to it (`TaskRunner`) and how a job's tasks are planned."""
