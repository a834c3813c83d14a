# syntax=docker/dockerfile:1
# LightStream's images, built from this repository's own files. One Dockerfile, three targets:
#   light  slim Python without torch: the front end (tokenizer), the router and the detokenizer
#   cpu    light's dependencies + CPU torch + redis-server: the worker on the CPU, the demo-model
#          maker; by default the whole stack in one container (lightstream serve: the demo model)
#   cuda   the CUDA runtime + CUDA torch (Triton with it) + redis-server: the worker on GPUs; by
#          default the whole stack in one container serving the model mounted at /model
# compose.yaml builds each target where a service uses it and gives each service its command; by hand:
#   docker build --target light -t lightstream:light .
#   docker build --target cuda -t lightstream:cuda .
#   docker run --gpus all -v /models/m:/model:ro -p 8000:8000 lightstream:cuda
# Every version is the one requirements.txt pins, which CI tests: torch too, from TORCH_INDEX
# (TORCH_SPEC, e.g. "torch==2.13.0", picks another); Triton is the one that torch pins.
# The health check asks the HTTP front end's /health on LS_PORT (8000 unless set); compose.yaml
# gives the services without an HTTP port their own check.
ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------- everything but torch
FROM ${PYTHON_IMAGE} AS light-deps
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY requirements.txt .
# xgrammar needs torch: it goes into the worker's images (cpu, cuda) only
RUN grep -vE '^(torch|triton|xgrammar)==' requirements.txt > /tmp/requirements-light.txt \
 && pip install -r /tmp/requirements-light.txt
# /model is owned by the service user, so a new named volume mounted there (the demo
# model's) is writable by the service that makes the model
RUN useradd --create-home lightstream && mkdir /model && chown lightstream /model
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LS_PORT', '8000'), timeout=3)"]

# ---------------------------------------------------------------- light: no torch
FROM light-deps AS light
# no torch here on purpose: transformers need not say so at every start
ENV TRANSFORMERS_VERBOSITY=error
COPY shared shared
COPY services services
COPY tools tools
COPY lightstream lightstream
USER lightstream
CMD ["python", "-m", "services.tokenizer"]

# ---------------------------------------------------------------- cpu: the worker on the CPU
FROM light-deps AS cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC=""
RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/* \
 && pip install --index-url ${TORCH_INDEX} "${TORCH_SPEC:-$(grep -E '^torch==' requirements.txt)}" \
 && pip install $(grep -E '^(xgrammar|triton)==' requirements.txt)
COPY shared shared
COPY services services
COPY tools tools
COPY lightstream lightstream
USER lightstream
CMD ["python", "-m", "lightstream", "serve"]

# ---------------------------------------------------------------- cuda: the worker on GPUs
FROM ${CUDA_IMAGE} AS cuda
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_SPEC=""
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
WORKDIR /app
COPY requirements.txt .
# torch first, so its own Triton is the one installed; then the rest without the CPU pins
RUN pip install --index-url ${TORCH_INDEX} "${TORCH_SPEC:-$(grep -E '^torch==' requirements.txt)}" \
 && grep -vE '^(torch|triton)==' requirements.txt > /tmp/requirements-light.txt \
 && pip install -r /tmp/requirements-light.txt
# ~/.triton exists and is the user's, so the named volume compose.gpu.yaml mounts there for
# Triton's compiled kernels is created writable by it
RUN useradd --create-home lightstream && mkdir /model /home/lightstream/.triton \
 && chown lightstream /model /home/lightstream/.triton
COPY shared shared
COPY services services
COPY tools tools
COPY lightstream lightstream
USER lightstream
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LS_PORT', '8000'), timeout=3)"]
CMD ["python", "-m", "lightstream", "serve", "/model"]
