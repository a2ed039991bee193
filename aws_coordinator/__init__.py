"""The AWS suite (installed as `weirflow_aws`, extra ``weirflow[aws]``): a Kinesis job's coordination,
checkpoints, metadata documents and Spark state on AWS, with no Azure account and no single machine.

* ``job.coordinator.factory: aws`` — leader election and task locks as KCL-style counter leases, latches and
  the processor registry, all in one DynamoDB table (`weirflow_aws.leases`, `.latch`, `.registry`);
* ``task.checkpoint.factory: dynamodb`` — checkpoints in a second DynamoDB table, fenced in the same
  conditional write (`weirflow_aws.checkpoints`);
* the metadata store (job model, drain notices) and the Spark state mirror follow the coordinator's alias:
  objects in S3 under the job's prefix, replaced with S3's conditional writes (`weirflow_aws.metadata`,
  `weirflow_aws.spark_state`).

Liveness never compares two hosts' clocks: as the Kinesis Client Library does, a reader judges a lease or a
heartbeat by whether its counter moved during the last stretch of the *reader's own* clock (docs/aws.md).
"""
