"""What the tests use that is not a test: the services they start, the faults they put on the wire, the fakes
they check against, and the way `make test` runs them. No test lives here, and the rule against sleeping as
synchronisation (tests/unit/test_test_hygiene.py) does not reach here: a launcher may poll a port it started.

Services started for the tests (and the benchmarks):

* `azurite` starts Azurite, the Azure Storage emulator (blob and table endpoints), on free ports; stopped and
  started again it keeps its ports and data, which is how a test takes storage away and gives it back.
* `kinesalite` starts kinesalite, a local Kinesis, in memory on a free port, with the dummy AWS credentials
  boto3 needs.
* `moto_server` starts moto's server, a local DynamoDB and S3 for the AWS suite, serving one request at a time.
* `spark_cluster` starts a Spark standalone master and worker from the pip-installed PySpark.

Faults and fakes:

* `tcp_proxy` forwards a local port to another and can blackhole it (a network partition: connections held
  open, nothing through); `AzuriteProxy` puts one in front of Azurite.
* `kinesis_faults` is an HTTP proxy in front of kinesalite that throttles `PutRecords` whole and fails some of
  their entries, as Kinesis does under load.
* `faketime` finds Debian's libfaketime, which makes a process see a shifted wall clock.
* `aws_calls` records every AWS call a test's code makes and what IAM would authorise it as; `iam_policy`
  evaluates IAM policies against those requests.
* `png` decodes a screenshot's pixels (headless Chromium's PNGs) without an imaging library.

Processes:

* `processors` runs one `weirflow run` processor until it exits, checks how it ended (finished, or killed by a
  fault point) and leaves nothing running.

How the suite runs:

* `spark_jvm` gives the suite's Spark driver JVMs cheaper options and a class-data-sharing archive, dumped in the
  background at the start of a run.
* `scheduling` is `make test`'s pytest-xdist scheduler: it gives a worker a file marked ``spark`` while the other
  runs one that mostly waits (tests/conftest.py hooks it in).
"""
