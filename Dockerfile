# weirflow processor image: Python 3.11, a Java runtime for Spark, weirflow with the [azure] extra, the job's
# code, a non-root user, `weirflow run` as entry point. docs/deploy.md builds and deploys it.
#
#   docker build -t <registry>/weirflow-pageviews:1 --build-arg JOB_DIR=examples/pageviews .
#
# The install steps are the Makefile's (`make install`: the JRE through apt when `java` is missing, then uv),
# run here with the image's own venv and extras, so the image and `make run` install the same way.
FROM python:3.11-slim

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/weirflow/src
COPY pyproject.toml Makefile README.md ./
COPY weirflow ./weirflow
COPY azure_coordinator ./azure_coordinator
COPY checkpoint ./checkpoint
COPY eventhub_system ./eventhub_system
COPY kinesis_system ./kinesis_system
COPY aws_coordinator ./aws_coordinator
COPY delta_system ./delta_system
RUN make install VENV=/opt/weirflow/venv EXTRAS=azure,monitor EDITABLE= \
 && rm -rf /var/lib/apt/lists/* /root/.cache
# Spark's class archive in the venv (weirflow/spark/class_archive.py): every processor starts Spark in about half
# the time.
RUN /opt/weirflow/venv/bin/weirflow spark-archive

# The job's code (its pipeline or task module); the config comes at run time (the container app mounts it at
# /config/job.yaml), so one image serves every config of the job.
ARG JOB_DIR=examples/pageviews
COPY ${JOB_DIR} /app/job

RUN useradd --create-home --uid 10001 weirflow \
 && mkdir -p /var/lib/weirflow \
 && chown weirflow /var/lib/weirflow
ENV PATH=/opt/weirflow/venv/bin:$PATH \
    PYTHONPATH=/app/job \
    PYTHONUNBUFFERED=1
USER weirflow
WORKDIR /app/job
ENTRYPOINT ["weirflow"]
CMD ["run", "/config/job.yaml", "--set", "job.state.dir=/var/lib/weirflow"]
