"""`weirflow upgrade`: drain the running version of a job, then hand the job to the new version under a new run.

The manual sequence of docs/drain.md ("Upgrading") as one command, so that nothing in it can be forgotten:

1. check that the new config is the same job (`job.name`, `job.id`, the same stores) and can run under a run
   of its own (its `app.run.id`, if it sets one, is not the drained run's);
2. drain the run the job runs now (the config's `app.run.id`, else the recorded run; `weirflow.job.runs`) and wait
   until every task drained and every processor exited: `weirflow drain --wait`;
3. record the next run (`RunBook.start_next`): the new version's processors join it whatever run id they
   would have chosen, and the drained version's processors, should they start again (a container platform
   restarts an exited replica), see that they were superseded and exit without running;
4. start the new version: one processor in this process (`weirflow run NEW`), or none with ``--no-run`` (on
   Azure the new revision starts them: infra/upgrade.sh).
"""

from __future__ import annotations

from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config

# Keys that say which job and which stores: an upgrade continues the same job in the same stores.
SAME_JOB_KEYS = ("job.name", "job.id", "job.coordinator.factory", "task.checkpoint.factory")


def check_same_job(current: Config, new: Config) -> None:
    """`ConfigError` naming the key when ``new`` is not a version of the job ``current`` describes."""
    for key in SAME_JOB_KEYS:
        if current.get(key) != new.get(key):
            raise new.error(
                key,
                f"is {new.get(key)!r} in the new version and {current.get(key)!r} in the running one: an upgrade "
                "continues the same job in the same stores (start a different job with `weirflow run`)",
            )


def check_next_run(new: Config, drained_run: str, run_id: str | None) -> str | None:
    """The run id the new version must run under, if it is fixed (``--run-id`` or the new config's
    `app.run.id`); None lets `weirflow.job.runs` make one. `ConfigError` when it is the drained run's (the new
    version would finish at once) or the two disagree."""
    configured = new.get("app.run.id") or None
    if run_id and configured and run_id != configured:
        raise new.error(
            "app.run.id", f"is {configured!r} but --run-id says {run_id!r}: give one or make them equal"
        )
    chosen = run_id or configured
    if chosen == drained_run:
        raise (
            new.error("app.run.id", f"is {chosen!r}, the run being drained: the new version would finish at once")
            if configured
            else ConfigError(f"--run-id {chosen!r} is the run being drained: the new version would finish at once")
        )
    return chosen
