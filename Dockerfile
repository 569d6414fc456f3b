# syntax=docker/dockerfile:1
# mfu-exporter image. Build from the repository root:  docker build -t mfu-exporter:0.1.0 .
# The base is pinned by version; pin it by digest too (python:3.11.14-slim-bookworm@sha256:...) where builds must be
# reproducible. Both stages use the same base so the wheels match the final interpreter and libc.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE CHANGELOG.md ./
COPY mfu_exporter ./mfu_exporter
COPY clients/python ./clients/python
# Wheels for the daemon, the client distribution it requires (clients/python) and every dependency. Anything without
# a binary wheel would be compiled here, never in the final image, which gets no compiler and no network access at
# install time.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ./clients/python .

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="mfu-exporter" \
      org.opencontainers.image.description="Prometheus exporter and live MFU monitor for LLM training nodes: GPUs, RDMA fabric, checkpoints and jobs." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/${PYTHON_IMAGE}"
# NVML is all the exporter needs from the driver: "utility" makes the NVIDIA container runtime mount just that.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=utility
# --no-index: only the wheels built above. Pinning to VERSION fails the build when the label would not match the code.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "mfu-exporter==${VERSION}"
# 65534 is "nobody" in the Debian base; numeric so Kubernetes' runAsNonRoot can check it without /etc/passwd.
USER 65534:65534
EXPOSE 9495
# The daemon is PID 1 (exec-form ENTRYPOINT): the probe reads its flags from /proc/1/cmdline and its MFU_EXPORTER_*
# env, then the config and web config files they name, so it asks /healthz on the daemon's port over HTTPS when
# tls_server_config is set and over HTTP otherwise. Exit 0 healthy, 1 unhealthy, as Docker wants.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["mfu-exporter", "healthcheck", "--daemon-pid", "1", "--timeout", "4"]
ENTRYPOINT ["mfu-exporter"]
