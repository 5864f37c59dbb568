# syntax=docker/dockerfile:1
# The kafka-diode image: the same install layout as a native install (docs/packaging.md), so the
# commands in docker-compose.yml, the systemd units and the native demo are the same commands.
#
#   docker build -t kafka-diode:local .
#
# bookworm, not the floating python:3.11-slim (now trixie): Debian 12 ships openjdk-17, which
# Spark 4 needs (Java 17+), and is what the project is tested on.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: install the package into the venv, fetch the Spark Kafka connector jars and compile
# the dedup's checkpoint file manager (javac: the JDK here, a runtime only below) ---------------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/kafka-diode/venv \
    KAFKA_DIODE_CACHE=/opt/kafka-diode/cache \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv "$VIRTUAL_ENV"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common ./common
COPY sender ./sender
COPY receiver ./receiver
COPY dedup ./dedup
COPY netem ./netem
COPY kafka_diode ./kafka_diode
RUN "$VIRTUAL_ENV/bin/pip" install . \
 && "$VIRTUAL_ENV/bin/kafka-diode" local-kafka fetch \
 && rm -rf "$KAFKA_DIODE_CACHE/maven"

# --- runtime: Python + a headless Java 17 for Spark; no compilers, no Maven ---------------------
# procps: Spark's launcher scripts use ps, as in the official Spark images. libisal2: ISA-L, the
# sender's FEC repair arithmetic by SIMD (common/wire/reed_solomon.py; zfec without it).
FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps libisal2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 kafka-diode \
 && useradd --system --uid 10001 --gid kafka-diode --home-dir /var/lib/kafka-diode \
      --shell /usr/sbin/nologin kafka-diode \
 && install -d -o kafka-diode -g kafka-diode -m 0750 /var/lib/kafka-diode /keys
COPY --from=build /opt/kafka-diode /opt/kafka-diode
ENV PATH=/opt/kafka-diode/venv/bin:$PATH \
    KAFKA_DIODE_CACHE=/opt/kafka-diode/cache \
    PYSPARK_PYTHON=/opt/kafka-diode/venv/bin/python \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER kafka-diode
WORKDIR /var/lib/kafka-diode
# No ENTRYPOINT: services name the full command ("kafka-diode send --config ..."), as the systemd
# units do. Run with an init (compose: init: true) so Spark's Python workers are reaped.
CMD ["kafka-diode", "--help"]
