#!/bin/sh
# Build upstream's own gVisor worker (agent-substrate's `ateom-gvisor`) for the third arm of
# tests/bench/bench_worker_api.py, from an agent-substrate git checkout or bare mirror SRC_DIR:
#
#   scripts/build-upstream-worker.sh SRC_DIR
#
# It builds the pinned commit (below; checked in SRC_DIR, whatever is checked out there) into
#   ${SUBSTRATE_GPU_CACHE:-/var/cache/substrate-gpu}/upstream-worker/<short>/ateom-gvisor
# with the commit's source beside it in src/ (the benchmark generates its client from
# src/internal/proto/ateompb/ateom.proto), outside the work tree. A cached binary is reused while
# its recorded sha256 still matches. Prints the binary's path on stdout (pass it as
# `--upstream-worker`), progress on stderr.
#
# Why this commit: 86e138f is the newest agent-substrate snapshot whose `ateom-gvisor` builds here
# (`go build -mod=vendor`: its dependencies are vendored, so no module proxy is needed; the Go
# module proxy does not serve agent-substrate, and CI cannot reach GitHub, so the arm is optional:
# tests/bench/_upstream_worker.py). Issue 31 §9.
set -eu

commit=86e138f628e419426be5ac9bbc68507e8333a4c4
short=86e138f

[ $# -eq 1 ] || {
    echo "usage: $0 SRC_DIR (an agent-substrate checkout or bare mirror holding commit $short)" >&2
    exit 2
}
src=$1

cache=${SUBSTRATE_GPU_CACHE:-/var/cache/substrate-gpu}/upstream-worker/$short
bin=$cache/ateom-gvisor

if [ -x "$bin" ] && [ -f "$bin.sha256" ] && [ -f "$cache/src/internal/proto/ateompb/ateom.proto" ]; then
    if (cd "$cache" && sha256sum --quiet -c ateom-gvisor.sha256); then
        echo "$bin"
        exit 0
    fi
    echo "build-upstream-worker: cached $bin does not match its recorded sha256; rebuilding" >&2
fi

# The commit must be the pinned one, in SRC_DIR's own object store (no fetch: no network here).
got=$(git -C "$src" rev-parse --verify --quiet "$commit^{commit}" 2>/dev/null) || {
    echo "build-upstream-worker: while looking for commit $commit in $src: not found (is it an" \
        "agent-substrate checkout or bare mirror holding it? git -C $src fetch origin $commit)" >&2
    exit 1
}
[ "$got" = "$commit" ] || {
    echo "build-upstream-worker: while verifying $src: $commit resolves to $got" >&2
    exit 1
}

command -v go >/dev/null || {
    echo "build-upstream-worker: while building ateom-gvisor $short: no 'go' on PATH" >&2
    exit 1
}

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT INT TERM
start=$(date +%s)

# git archive: the commit's tree alone, whatever SRC_DIR has checked out (or not: bare).
echo "build-upstream-worker: extracting $short from $src" >&2
mkdir "$work/src"
git -C "$src" archive --format=tar "$commit" | tar -x -C "$work/src"

echo "build-upstream-worker: building ./cmd/ateom-gvisor (vendored; minutes on a cold Go cache)" >&2
# CGO_ENABLED=0: nothing it links needs cgo, and a static binary runs in the benchmark's
# unshared namespaces whatever libc is there.
(cd "$work/src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=vendor go build -trimpath \
    -o "$work/ateom-gvisor" ./cmd/ateom-gvisor)

(cd "$work" && sha256sum ateom-gvisor >ateom-gvisor.sha256)
rm -rf "$cache/src"
mv "$work/src" "$cache/src"
mv "$work/ateom-gvisor.sha256" "$bin.sha256.new"
mv "$work/ateom-gvisor" "$bin"
mv "$bin.sha256.new" "$bin.sha256"
echo "build-upstream-worker: built $bin in $(($(date +%s) - start)) s" >&2
echo "$bin"
