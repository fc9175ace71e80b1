#!/usr/bin/env bash
# The real image, built by a real OCI builder (podman) from the unchanged Dockerfile, then
# run and tested as a container (issue 30). On a machine like ours: no Docker engine, no
# registry of base images, network to Ubuntu's archive and PyPI only.
#
#   bench/image.sh setup            podman's settings for this sandbox (runc, no ulimits)
#   bench/image.sh base             make ubuntu:24.04 locally (faithful to the official one)
#   bench/image.sh build VARIANT    build one variant: cpu | cuda | cpu-diarization |
#                                   cuda-diarizer-gpu | cuda-r550 | cuda-r535
#   bench/image.sh test VARIANT     the container tests (tests/test_image.py) against it
#   bench/image.sh measure VARIANT  sizes layer by layer, start-up with the page cache
#                                   dropped and warm
#   bench/image.sh all              setup, base, then build + test + measure every variant
#
# MODEL (default tiny.en for cpu, base for the others): tiny.en | base | a folder; it is
# copied into the build context's models/ folder and baked with WHISPER_MODEL=models/NAME,
# as a user bakes a folder of their own. Images are tagged whisper-worker:VARIANT.
# NO_CACHE=1 builds every step again (downloads included: the build times in docs/deploy.md).
# Needs root (debootstrap, podman's storage). Every step fails loudly (set -e); the log of
# each build is bench/out/image/build-VARIANT.log.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=$REPO/bench/out/image
MIRROR=${MIRROR:-http://archive.ubuntu.com/ubuntu}
mkdir -p "$OUT"
PODMAN=(podman --runtime runc)
# --format docker: podman's default OCI format drops the Dockerfile's SHELL (pipefail), so
# the image would not be built as Docker builds it.

setup() {
    # crun refuses this machine's hybrid cgroups; the sandbox lacks CAP_SYS_RESOURCE, so
    # the runtime's setrlimit of NOFILE/NPROC is refused unless no default ulimit is set.
    mkdir -p /etc/containers
    if ! grep -q 'default_ulimits = \[\]' /etc/containers/containers.conf 2>/dev/null; then
        printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' \
            > /etc/containers/containers.conf
    fi
    command -v podman > /dev/null && command -v runc > /dev/null && command -v debootstrap > /dev/null \
        || { echo "needs: apt-get install podman buildah runc debootstrap" >&2; exit 1; }
}

base() {
    # ubuntu:24.04 as Canonical builds it (the ubuntu-base tarball behind the official
    # image): minbase, minimized (no docs, man pages or locales; the dpkg excludes and the
    # apt settings the image ships), deb822 sources with main restricted universe
    # multiverse for noble, -updates, -backports and -security, the `ubuntu` user (uid
    # 1000), CMD /bin/bash. Differences: packages are today's from the archive, not the
    # image's snapshot; Debian's debootstrap has no Ubuntu keyring, so the Release files
    # are not GPG-checked while debootstrap runs (apt inside the image checks them with
    # the ubuntu-keyring it installed).
    if "${PODMAN[@]}" image exists ubuntu:24.04 && [ "${REBUILD_BASE:-0}" != 1 ]; then
        echo "ubuntu:24.04 exists (REBUILD_BASE=1 makes it again)"; return
    fi
    local root=$OUT/ubuntu-root
    rm -rf "$root"
    debootstrap --variant=minbase --components=main --no-check-gpg noble "$root" "$MIRROR" \
        /usr/share/debootstrap/scripts/gutsy > "$OUT/debootstrap.log" 2>&1 \
        || { tail -20 "$OUT/debootstrap.log" >&2; exit 1; }
    cat > "$root/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF'
# Drop all man pages
path-exclude=/usr/share/man/*
# Drop all translations
path-exclude=/usr/share/locale/*/LC_MESSAGES/*.mo
# Drop all documentation ...
path-exclude=/usr/share/doc/*
# ... except copyright files ...
path-include=/usr/share/doc/*/copyright
# ... and Debian changelogs for native & non-native packages
path-include=/usr/share/doc/*/changelog.*
# Drop info pages
path-exclude=/usr/share/info/*
# Drop lintian overrides
path-exclude=/usr/share/lintian/*
EOF
    cat > "$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/docker-no-languages"
    echo 'Acquire::GzipIndexes "true";' > "$root/etc/apt/apt.conf.d/docker-gzip-indexes"
    printf 'Apt::AutoRemove::SuggestsImportant "false";\n' \
        > "$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -name 'changelog.*' \
        -not -type d -delete
    rm -rf "$root"/usr/share/{man,info,lintian}/* "$root"/var/cache/apt/*.bin \
        "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
    find "$root/usr/share/locale" -name '*.mo' -delete 2>/dev/null || true
    rm -f "$root/etc/apt/sources.list"
    cat > "$root/etc/apt/sources.list.d/ubuntu.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

Types: deb
URIs: ${SECURITY_MIRROR:-http://security.ubuntu.com/ubuntu}
Suites: noble-security
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
EOF
    chroot "$root" bash -c 'groupadd --gid 1000 ubuntu && useradd --uid 1000 --gid 1000 \
        --create-home --shell /bin/bash ubuntu' > /dev/null
    : > "$root/etc/resolv.conf"
    rm -f "$root/etc/hostname"
    tar -C "$root" --numeric-owner -c . | "${PODMAN[@]}" import \
        --change 'CMD ["/bin/bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        - ubuntu:24.04 > /dev/null
    rm -rf "$root"
    "${PODMAN[@]}" tag ubuntu:24.04 docker.io/library/ubuntu:24.04
    echo "ubuntu:24.04: $("${PODMAN[@]}" image inspect ubuntu:24.04 --format '{{.Size}}' \
        | awk '{printf "%.0f MiB", $1/1048576}')"
}

VARIANTS=(cpu cuda cpu-diarization cuda-diarizer-gpu cuda-r550 cuda-r535)

variant_args() {
    # The build arguments of each variant the Dockerfile offers.
    case "$1" in
        cpu) echo "--build-arg WHISPER_IMAGE=cpu" ;;
        cuda) echo "" ;;
        cpu-diarization) echo "--build-arg WHISPER_IMAGE=cpu --build-arg DIARIZATION=true" ;;
        cuda-diarizer-gpu) echo "--build-arg DIARIZATION=true --build-arg DIARIZER_GPU=true" ;;
        cuda-r550|cuda-r535) echo "--build-arg WHISPER_IMAGE=$1" ;;
        *) echo "unknown variant $1 (${VARIANTS[*]})" >&2; exit 2 ;;
    esac
}

stage_model() {
    # The model folder, copied into the build context's models/ (ignored by git).
    local name=${MODEL:-tiny.en} src
    src=$(.venv/bin/python -c "import sys; from pathlib import Path; \
from speech_assets.models import model_dir; print(model_dir(sys.argv[1], Path('bench/out/whisper-base')))" "$name")
    local dest
    dest=$(basename "$name")
    rm -rf "models/$dest"
    cp -rL "$src" "models/$dest"
    echo "$dest"
}

build() {
    local variant=$1 model t0 args
    args=$(variant_args "$variant")
    model=$(stage_model)
    t0=$(date +%s)
    # This machine reaches PyPI through a proxy with its own CA. The build's RUN steps get the
    # host's CA bundle and a pip.conf naming it as read-only volumes: they are not layers,
    # so nothing of it reaches the image and the Dockerfile stays as users build it.
    local vols=()
    if [ -n "${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}" ]; then
        printf '[global]\ncert = /etc/host-ca.crt\n' > "$OUT/pip.conf"
        vols=(-v "${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}:/etc/host-ca.crt:ro"
              -v "$OUT/pip.conf:/etc/pip.conf:ro")
    fi
    # shellcheck disable=SC2086
    if ! "${PODMAN[@]}" build --pull=never --layers --format docker "${vols[@]}" \
            ${NO_CACHE:+--no-cache} -f Dockerfile \
            -t "whisper-worker:$variant" \
            $args --build-arg WHISPER_MODEL="models/$model" \
            --build-arg TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://pypi.org/simple}" \
            . > "$OUT/build-$variant.log" 2>&1; then
        tail -30 "$OUT/build-$variant.log" >&2
        echo "BUILD FAILED: $variant (log: $OUT/build-$variant.log)" >&2
        exit 1
    fi
    echo "built whisper-worker:$variant (model $model) in $(( $(date +%s) - t0 )) s"
}

test_image() {
    WHISPER_TEST_IMAGE="whisper-worker:$1" .venv/bin/python -m pytest -q -p no:cacheprovider \
        tests/test_image.py
}

measure() {
    # Sizes layer by layer (bench/image/image_sizes.py), then `podman run` of the default command
    # (test_input.json, offline) with the page cache dropped (a host that has the image but
    # has not run it lately) and warm: seconds to the worker ready (its start-up log's
    # "ready" mark) and to the job's result (the container has exited).
    local image="whisper-worker:$1" t0 t1 log ready
    .venv/bin/python -c 'from bench import machine; print(machine.line(machine.describe()))'
    .venv/bin/python -m bench image-sizes "$image"
    echo "| start ($image) | podman run -> worker ready, s | -> job done, container gone, s |"
    echo "|---|---|---|"
    for cache in dropped dropped dropped warm warm warm; do
        if [ "$cache" = dropped ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
        t0=$(date +%s.%N)
        log=$("${PODMAN[@]}" run --rm --network none "$image" 2>&1) \
            || { printf '%s\n' "$log" | tail -20 >&2; exit 1; }
        t1=$(date +%s.%N)
        printf '%s\n' "$log" | grep -q "Job local_test completed successfully" \
            || { printf '%s\n' "$log" | tail -20 >&2; exit 1; }
        ready=$(printf '%s\n' "$log" | .venv/bin/python -c "import json, re, sys
for line in sys.stdin:
    m = re.search(r'startup (\{.*\})', line)
    if m:
        print(round(json.loads(m.group(1))['marks']['ready'] - $t0, 2)); break")
        echo "| page cache $cache | $ready | $(.venv/bin/python -c "print(round($t1 - $t0, 2))") |"
    done
}

case "${1:-}" in
    setup) setup ;;
    base) setup; base ;;
    build) setup; build "${2:?variant}" ;;
    test) setup; test_image "${2:?variant}" ;;
    measure) setup; measure "${2:?variant}" ;;
    all)
        setup; base
        for v in "${VARIANTS[@]}"; do build "$v"; test_image "$v"; done
        for v in "${VARIANTS[@]}"; do measure "$v"; done ;;
    *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
