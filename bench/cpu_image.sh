#!/usr/bin/env bash
# The CPU image (Dockerfile, WHISPER_IMAGE=cpu) measured on a machine with no Docker engine
# and no registry of base images (issue 23): the Dockerfile's steps for that image, replayed
# one by one in a chroot of Ubuntu 24.04 made with debootstrap from Ubuntu's own archive
# (minbase, minimized like the ubuntu:24.04 image: no docs, man pages or locales), prints
# what each step adds (the image's layers), the whole tree, its gzip size (what a
# registry stores and a host pulls), and the worker's start-up inside it as the image
# starts it (uid 10001, the image's environment, `python -m handler` on test_input.json),
# with the page cache dropped and warm.
#
#   bench/cpu_image.sh [MODEL_DIR]   (as root)   (default: the base model assembled by speech_assets)
#   DIARIZER=models/diarizer bench/cpu_image.sh   the DIARIZATION=true variant: the
#       diarizer's export (python -m builder.diarizer, made here: the export stage needs torch
#       from the PyTorch CPU index, which these machines do not reach) copied as that stage's
#       /out/diarizer is, WHISPER_DIARIZATION=true, and the job asks for diarize
#
# Needs root (debootstrap, chroot, mount), debootstrap and Ubuntu's archive over HTTP.
# The tree lives in bench/out/cpu-image/ and is removed at the end (KEEP=1 keeps it).
# Release files are not GPG-checked by debootstrap here (Debian's debootstrap has no
# Ubuntu keyring): the tree is a measurement, deleted after, never shipped. Inside it apt
# checks with the ubuntu-keyring debootstrap installed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=$REPO/bench/out/cpu-image
ROOT=$OUT/root
MIRROR=${MIRROR:-http://archive.ubuntu.com/ubuntu}
MODEL_DIR=${1:-}
if [ -z "$MODEL_DIR" ]; then
    MODEL_DIR=$(python -c "from pathlib import Path; from speech_assets.models import base_dir; \
print(base_dir(Path('bench/out/whisper-base')))")
fi

mounted=()
cleanup() {
    for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
    if [ "${KEEP:-0}" != 1 ]; then rm -rf "$ROOT"; fi
}
trap cleanup EXIT

mib() { du -sxm "$ROOT" | cut -f1; }
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv "$@"; }
layer() { local before=$1 name=$2; echo "| $name | $(( $(mib) - before )) |"; }

rm -rf "$ROOT" && mkdir -p "$OUT"
echo "$(python -c 'from bench import machine; print(machine.line(machine.describe()))')"
start=$(date +%s)

# FROM ubuntu:24.04
debootstrap --variant=minbase --components=main --no-check-gpg noble "$ROOT" "$MIRROR" \
    /usr/share/debootstrap/scripts/gutsy > "$OUT/debootstrap.log" 2>&1
cat > "$ROOT/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
EOF
find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
rm -rf "$ROOT"/usr/share/{man,info,locale,lintian}/* "$ROOT"/var/cache/apt/*.bin \
    "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
# The components and suites the ubuntu:24.04 image's apt sources name.
for suite in noble noble-updates noble-security; do
    echo "deb $MIRROR $suite main restricted universe multiverse"
done > "$ROOT/etc/apt/sources.list"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
for m in proc sys dev; do mount --bind "/$m" "$ROOT/$m"; mounted=("$ROOT/$m" "${mounted[@]}"); done
echo
echo "| layer (Dockerfile step) | MiB |"
echo "|---|---|"
echo "| ubuntu 24.04 minbase, minimized (stands for ubuntu:24.04) | $(mib) |"

# RUN apt-get install ca-certificates python3 python3-venv; venv; the worker user
b=$(mib)
in_root bash -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    ca-certificates python3 python3-venv > /dev/null && rm -rf /var/lib/apt/lists/* \
    /var/cache/apt/*.bin /var/cache/apt/archives/*.deb && python3 -m venv /opt/venv \
    && groupadd --gid 10001 worker \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin worker"
layer "$b" "system packages: python3, python3-venv, ca-certificates; the venv"

# RUN pip install -r requirements.txt -c constraints.txt (from pyproject.toml)
b=$(mib)
mkdir -p "$ROOT/build"
cp pyproject.toml builder/constraints.txt README.md "$ROOT/build/"
# This machine reaches PyPI through a proxy with its own CA: pip in the tree is given the
# host's bundle for this step only (in /build, which the last step removes).
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/build/host-ca.crt"
in_root bash -c "cd /build && export PIP_CERT=/build/host-ca.crt && python -c \"import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(p['project']['dependencies'] + p['build-system']['requires']))\" > requirements.txt \
    && pip install -q --no-cache-dir -r requirements.txt -c constraints.txt"
rm "$ROOT/build/host-ca.crt"
layer "$b" "Python dependencies (pip, pyproject.toml + builder/constraints.txt)"

# RUN python -m builder.fetch_model --model ... --dest /models
b=$(mib)
cp -r builder "$ROOT/build/builder"
cp -rL "$MODEL_DIR" "$ROOT/build/model"
in_root bash -c "cd /build && HF_HUB_OFFLINE=1 python -m builder.fetch_model --model /build/model \
    --dest /models > /dev/null && rm -rf /build/model && chmod -R a+rX /models"
layer "$b" "the model ($(basename "$MODEL_DIR"), baked by builder.fetch_model)"

# COPY handler/; RUN pip install --no-deps . && rm -rf /build
b=$(mib)
cp -r handler "$ROOT/build/handler"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/build/host-ca.crt"
in_root bash -c "cd /build && PIP_CERT=/build/host-ca.crt pip install -q --no-cache-dir --no-deps --no-build-isolation . \
    && cd / && rm -rf /build"
layer "$b" "the worker's code (installed, bytecode compiled)"
DIARIZATION=false
if [ -n "${DIARIZER:-}" ]; then
    # COPY --from=diarizer /out/ /models/ ; ENV WHISPER_DIARIZATION=true
    b=$(mib)
    cp -r "$DIARIZER" "$ROOT/models/diarizer" && chmod -R a+rX "$ROOT/models/diarizer"
    DIARIZATION=true
    layer "$b" "the diarizer (DIARIZATION=true)"
fi
total=$(mib)
gz=$(tar -C "$ROOT" --one-file-system --exclude=./proc --exclude=./sys --exclude=./dev \
    -cf - . | gzip -6 | wc -c)
echo "| **the image** | **$total** ($(( gz / 1048576 )) MiB gzipped) |"
echo "built in $(( $(date +%s) - start )) s (downloads included)"

# CMD ["python", "-m", "handler"] as USER 10001, WORKDIR /home/worker, the image's ENV
python -c "import json, sys; job = json.load(open('test_input.json')); \
job['input']['diarize'] = sys.argv[1] == 'true'; \
json.dump(job, open(sys.argv[2], 'w'))" "$DIARIZATION" "$ROOT/home/worker/test_input.json"
echo
echo "| start | ready s (chroot exec -> model loaded, warmed up) | job done and exited, s |"
echo "|---|---|---|"
for cache in dropped dropped dropped warm warm warm; do
    if [ "$cache" = dropped ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
    t0=$(date +%s.%N)
    log=$(cd "$ROOT" && chroot --userspec=10001:10001 "$ROOT" /usr/bin/env -i \
        PATH=/opt/venv/bin:/usr/bin:/bin HOME=/home/worker PYTHONUNBUFFERED=1 \
        WHISPER_MANIFEST=/models/manifest.json WHISPER_DOWNLOAD_ROOT=/models/hf \
        WHISPER_DIARIZATION=$DIARIZATION \
        HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 RUNPOD_LOG_LEVEL=INFO \
        bash -c 'cd /home/worker && python -m handler' 2>&1) || true
    t1=$(date +%s.%N)
    ready=$(printf '%s\n' "$log" | python -c "import json, re, sys
for line in sys.stdin:
    m = re.search(r'(\{.*\"ready\".*\})', line)
    if m:
        print(round(json.loads(m.group(1))['marks']['ready'] - $t0, 2)); break
else:
    print('none')")
    # The job must have ended in a result with text (RunPod's local test prints it).
    if [ "$ready" = none ] || ! printf '%s\n' "$log" | grep -q "Job result: {'output': {'text': '[^']"; then
        printf '%s\n' "$log" | tail -20 | cut -c1-300; exit 1
    fi
    if [ "$DIARIZATION" = true ] && ! printf '%s\n' "$log" | grep -q "'speaker': 'A'"; then
        printf '%s\n' "$log" | tail -5 | cut -c1-300; exit 1
    fi
    echo "| page cache $cache | $ready | $(python -c "print(round($t1 - $t0, 2))") |"
done
