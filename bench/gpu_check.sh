#!/usr/bin/env bash
# The GPU check (issue 9): turbo and large-v3 on one GPU, under 8 minutes, one JSON + table.
# On a machine without models baked, point WHISPER_DOWNLOAD_ROOT at a Hugging Face cache
# that holds them (python -m builder.fetch_model --model turbo --dest ./models).
# The diarizer is timed too when models/diarizer exists (python -m builder.diarizer
# --dest models/diarizer; carry it to a machine without the network).
# Tested on the CPU with: bench/gpu_check.sh --device cpu --models tiny.en --batches 1,8
#                         --long-seconds 60 --burst 12 --marathon-minutes 1
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 python -m bench gpu-check "$@"
