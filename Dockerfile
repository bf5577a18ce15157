# The sidecar image: small, non-root, no GPU libraries needed (libnvidia-ml.so.1 is injected by the
# NVIDIA container toolkit when the pod requests a GPU or sets NVIDIA_VISIBLE_DEVICES).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN pip install --no-cache-dir . && useradd --uid 10001 sidecar
USER 10001
EXPOSE 8080 9090
ENTRYPOINT ["sidecar", "serve"]
