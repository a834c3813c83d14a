# syntax=docker/dockerfile:1
# LightStream's images, built from this repository's own files. One Dockerfile, three targets:
#   light  slim Python without torch: the front end (tokenizer), the router and the detokenizer
#   cpu    light's dependencies + CPU torch + redis-server: the worker on the CPU, the demo-model
#          maker, and the all-in-one container (tools/run_local.py) of tools/quick_launch_docker.py
#   cuda   the CUDA runtime + CUDA torch (Triton with it) + redis-server: the worker on GPUs
# compose.yaml builds each target where a service uses it; by hand:
#   docker build --target light -t lightstream:light .
#   docker build --target cuda -t lightstream:cuda .
# torch comes from TORCH_INDEX (TORCH_SPEC picks the version); everything else is pinned by
# requirements.txt, which CI tests.
ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------- everything but torch
FROM ${PYTHON_IMAGE} AS light-deps
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY requirements.txt .
RUN grep -vE '^(torch|triton)==' requirements.txt > /tmp/requirements-light.txt \
 && pip install -r /tmp/requirements-light.txt
# /model is owned by the service user, so a new named volume mounted there (the demo
# model's) is writable by the service that makes the model
RUN useradd --create-home lightstream && mkdir /model && chown lightstream /model

# ---------------------------------------------------------------- light: no torch
FROM light-deps AS light
# no torch here on purpose: transformers need not say so at every start
ENV TRANSFORMERS_VERBOSITY=error
COPY shared shared
COPY services services
COPY tools tools
USER lightstream
CMD ["python", "-m", "services.tokenizer"]

# ---------------------------------------------------------------- cpu: the worker on the CPU
FROM light-deps AS cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC="torch>=2.4"
RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/* \
 && pip install --index-url ${TORCH_INDEX} "${TORCH_SPEC}"
COPY shared shared
COPY services services
COPY tools tools
USER lightstream
CMD ["python", "-m", "services.worker", "--device", "cpu"]

# ---------------------------------------------------------------- cuda: the worker on GPUs
FROM ${CUDA_IMAGE} AS cuda
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_SPEC="torch>=2.4"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
WORKDIR /app
COPY requirements.txt .
# torch first, so its own Triton is the one installed; then the rest without the CPU pins
RUN pip install --index-url ${TORCH_INDEX} "${TORCH_SPEC}" \
 && grep -vE '^(torch|triton)==' requirements.txt > /tmp/requirements-light.txt \
 && pip install -r /tmp/requirements-light.txt
# ~/.triton exists and is the user's, so the named volume compose.gpu.yaml mounts there for
# Triton's compiled kernels is created writable by it
RUN useradd --create-home lightstream && mkdir /model /home/lightstream/.triton \
 && chown lightstream /model /home/lightstream/.triton
COPY shared shared
COPY services services
COPY tools tools
USER lightstream
CMD ["python", "-m", "services.worker", "--device", "cuda"]
