#!/bin/sh
# go_unit.sh BUILD_DIR: the Go client's checks (client/go): gofmt, go vet (with the
# integration tests' build tag too), its unit tests (fakes of the gateway: httptest), and
# the Go examples (examples/go) vetted and built into BUILD_DIR/go/bin. Go's caches live in
# BUILD_DIR/go; no network (GOPROXY=off: the module has no dependencies), nothing is
# written to the source tree. Exit 77 (skipped) when go is not installed.
set -eu
if ! command -v go >/dev/null 2>&1; then
  echo "go_unit.sh: skipped 'go is not installed (Debian's golang-go; tools/setup.sh --test)'"
  exit 77
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(cd "$1" && pwd)/go
mkdir -p "$out/bin"
export GOCACHE="$out/cache" GOPATH="$out/path" GOMODCACHE="$out/path/pkg/mod" GOPROXY=off \
  GOFLAGS=-mod=mod GOENV=off GO111MODULE=on GOSUMDB=off GOTOOLCHAIN=local
go version
bad=$(gofmt -l "$src/client/go" "$src/examples/go")
if [ -n "$bad" ]; then
  echo "not gofmt-formatted: $bad"
  exit 1
fi
cd "$src/client/go"
go vet ./...
go vet -tags integration ./...
go test -count=1 -v ./...
cd "$src/examples/go"
go vet ./...
go build -o "$out/bin/" ./...
echo "go examples built: $(ls "$out/bin" | tr '\n' ' ')"
