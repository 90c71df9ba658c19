#!/bin/sh
# Build gVisor's runsc from the pinned go-branch version (scripts/runsc.version) and cache it outside
# the work tree:  ${SUBSTRATE_GPU_CACHE:-/var/cache/substrate-gpu}/runsc/<version>/runsc
# A cached binary is reused only while its recorded sha256 still matches (a second run costs well
# under a second); otherwise it is rebuilt. Prints the binary's path on stdout, progress on stderr.
#
# Why not `go install gvisor.dev/gvisor/runsc@<version>`: gVisor's go.mod may carry `replace`
# directives, which `go install pkg@version` refuses and a plain dependency ignores. So the module is
# downloaded, its directory copied out of the read-only module cache, and built in place, where its
# own go.mod (replaces included) applies.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
pin="$here/runsc.version"
field() { sed -n "s/^$1=//p" "$pin"; }
module=$(field module)
version=$(field version)
sum=$(field sum)
[ -n "$module" ] && [ -n "$version" ] && [ -n "$sum" ] || {
    echo "build-runsc: while reading $pin: module=, version= and sum= are all required" >&2
    exit 1
}

cache=${SUBSTRATE_GPU_CACHE:-/var/cache/substrate-gpu}/runsc/$version
bin=$cache/runsc

if [ -x "$bin" ] && [ -f "$bin.sha256" ]; then
    if (cd "$cache" && sha256sum --quiet -c runsc.sha256) \
        && "$bin" --version 2>/dev/null | grep -qx "runsc version $version"; then
        echo "$bin"
        exit 0
    fi
    echo "build-runsc: cached $bin does not match its recorded sha256 or version; rebuilding" >&2
fi

command -v go >/dev/null || {
    echo "build-runsc: while building runsc $version: no 'go' on PATH (Go >= 1.26 is needed)" >&2
    exit 1
}

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT INT TERM
start=$(date +%s)

# A scratch module so `go mod download` has somewhere to stand; nothing is built in it.
mkdir "$work/scratch"
(cd "$work/scratch" && GOTOOLCHAIN=local go mod init scratch >/dev/null 2>&1)
echo "build-runsc: downloading $module@$version" >&2
json=$(cd "$work/scratch" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$module@$version")
dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
got=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')
[ "$got" = "$sum" ] || {
    echo "build-runsc: while downloading $module@$version: module hash $got, pinned $sum" >&2
    exit 1
}
cp -R "$dir" "$work/src"
chmod -R u+w "$work/src"

echo "build-runsc: building runsc (CGO_ENABLED=0; several minutes on a cold Go cache)" >&2
# -X: `runsc --version` names the pinned version (a plain `go build` says VERSION_MISSING);
# the checkpoint manifest records it.
(cd "$work/src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$version" -o "$work/runsc" ./runsc)
"$work/runsc" --version | grep -qx "runsc version $version" || {
    echo "build-runsc: the built runsc does not report version $version" >&2
    exit 1
}

(cd "$work" && sha256sum runsc >runsc.sha256)
mv "$work/runsc.sha256" "$bin.sha256.new"
mv "$work/runsc" "$bin"
mv "$bin.sha256.new" "$bin.sha256"
echo "build-runsc: built $bin in $(($(date +%s) - start)) s" >&2
echo "$bin"
