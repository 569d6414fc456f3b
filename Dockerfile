# syntax=docker/dockerfile:1
# mfu-exporter image. Build from the repository root:  docker build -t mfu-exporter:0.1.0 .
# The base is pinned by version; pin it by digest too (python:3.11.14-slim-bookworm@sha256:...) where builds must be
# reproducible. Both stages use the same base so the wheels match the final interpreter and libc.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Wheels for the package and every dependency. Anything without a binary wheel would be compiled here, never in the
# final image, which gets no compiler and no network access at install time.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

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
# No curl in the slim image; the interpreter is there anyway. Follows MFU_EXPORTER_WEB_LISTEN_ADDRESS's port.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('MFU_EXPORTER_WEB_LISTEN_ADDRESS', ':9495').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]
ENTRYPOINT ["mfu-exporter"]
