# LightStream image: every service runs from it (python -m services.<name>).
# BASE picks the runtime: the default slim Python serves on the CPU; build the GPU image with
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN if ! command -v python3 >/dev/null; then apt-get update && apt-get install -y --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*; fi \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY requirements.txt .
RUN pip install --index-url ${TORCH_INDEX} --extra-index-url https://pypi.org/simple "torch>=2.4" \
 && grep -v '^torch==' requirements.txt > /tmp/req.txt && pip install -r /tmp/req.txt
COPY shared shared
COPY services services
COPY tools tools
RUN useradd --create-home lightstream && mkdir -p /models && chown lightstream /models
USER lightstream
CMD ["python", "-m", "services.tokenizer"]
