# syntax=docker/dockerfile:1
# The sidecar image: two stages, hash-locked dependencies, non-root, no build tools in the result.
# NVML (libnvidia-ml.so.1) is not in the image: the NVIDIA runtime injects it into a container
# that is given a GPU (the DRA overlay); without one the sidecar plans from the engine or declared
# numbers. Pin the base by digest where you build:
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm   # -> sha256:...
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:... .
# Dependencies: deploy/docker/*.lock (`make lock` regenerates them, see docs/deploy.md).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY deploy/docker/requirements.lock deploy/docker/build-requirements.lock ./
# Runtime dependencies, every file checked against its locked hash, into the venv we ship;
# setuptools (to build our own wheel) into a throw-away one.
RUN python -m venv /opt/sidecar \
    && /opt/sidecar/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes --no-deps -r build-requirements.lock
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/sidecar/bin/pip install --no-cache-dir --no-deps --no-index /wheels/*.whl

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpu-admission-sidecar" \
      org.opencontainers.image.description="GPU-aware admission controller sidecar for vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/sidecar/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin sidecar
COPY --from=build /opt/sidecar /opt/sidecar
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["sidecar", "serve"]
