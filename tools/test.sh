#!/usr/bin/env bash
# Builds idemd and runs every test: once in a normal build (gcc) and once under
# AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included); then builds with
# clang and libFuzzer (warnings are errors there too), runs the unit tests again and every
# fuzzer over its seed corpus for a bounded run; last, builds the Release configuration
# (-O3, whose flow analysis warns where -O2's does not; built, not run). Exits non-zero on
# any failure.
# Benchmarks (label `bench`) are programs, not tests: run them with
#   ctest --test-dir build -L bench --verbose   or   build/bin/fsm-bench
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh

jobs=$(nproc)
run_suite() {
  local dir=$1
  shift
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -LE 'bench' -j "$jobs"
}

echo "== normal build (RelWithDebInfo)"
run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo

echo "== sanitizer build (ASan + UBSan + LSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON

echo "== clang build with libFuzzer targets (unit tests, then each fuzzer for a bounded run)"
CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Debug -DIDEM_FUZZ=ON >/dev/null
cmake --build build-clang -j "$jobs"
ctest --test-dir build-clang --output-on-failure --no-tests=error -L 'unit|fuzz' -j "$jobs"

echo "== release build (-O3; built, not run: its warnings are errors too)"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "$jobs"
