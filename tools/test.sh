#!/usr/bin/env bash
# Builds idemd and runs every test: once in a normal build (gcc) and once under
# AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included); then builds with
# clang and libFuzzer (warnings are errors there too), runs the unit tests again and every
# fuzzer for a bounded run over its checked-in corpus and the build's seeds (what it finds
# stays in the build tree; tools/fuzz.sh runs longer and grows tests/fuzz/corpus/); last,
# builds the Release configuration (-O3, whose flow analysis warns where -O2's does not;
# built, not run). Exits non-zero on any failure.
#
# Each ctest run writes <build dir>/ctest-junit.xml; at the end (also after a failure) the
# skipped tests are listed with their reasons where the output gives one, and the last line
# adds up every run:
#   tests: N passed, N failed, N skipped
# A skip is a test that could not run here (no root or /dev/fuse, /tmp not on ext4, no clang
# for the fuzz targets). Under CI (CI=true) any skip fails the run: CI's machine is root with
# /dev/fuse, ext4 and clang (tools/setup.sh --test installs the packages), so every test can run
# there. Outside CI skips are allowed, and listed.
# Benchmarks (label `bench`) are programs, not tests: run them with
#   ctest --test-dir build -L bench --verbose   or   build/bin/fsm-bench
set -euo pipefail
cd "$(dirname "$0")/.."

# Every ctest run so far, as "STAGE=JUNIT_FILE"; and the stages that were left out, as
# "STAGE=REASON" (their tests count as skipped).
runs=()
left_out=()

# The summary, on every exit: the skipped tests, then the totals on the last line. Exits
# with the script's status, or 1 when it was 0 but CI skipped a test.
summary() {
  local rc=$? src=0
  trap - EXIT
  echo "== summary"
  python3 - "$rc" "${CI:-}" "${#runs[@]}" "${runs[@]}" "${left_out[@]}" <<'PY' || src=$?
import glob, os, re, sys
import xml.etree.ElementTree as ET

rc, ci = int(sys.argv[1]), sys.argv[2].lower() in ("true", "1", "yes")
nruns = int(sys.argv[3])
runs = [a.split("=", 1) for a in sys.argv[4:4 + nruns]]
left_out = [a.split("=", 1) for a in sys.argv[4 + nruns:]]
# Every fuzz target (tests/fuzz/fuzz_<name>.c): the clang stage must have run each one.
fuzz_tests = sorted("fuzz." + os.path.basename(p)[:-2] for p in glob.glob("tests/fuzz/fuzz_*.c"))

def reasons(out):
    """Why a test skipped, from its output: unittest's "... skipped 'WHY'" lines, and the
    lines a cmocka test printed between its [ RUN ] and [  SKIPPED ] lines."""
    found, pending = [], []
    for line in out.splitlines():
        m = re.search(r"\bskipped '(.*)'\s*$", line)
        if m:
            found.append(m.group(1))
        elif line.startswith("[ RUN"):
            pending = []
        elif line.startswith("[  SKIPPED ]"):
            found.extend(pending)
            pending = []
        elif not line.startswith("["):
            pending.append(line.strip())
    return list(dict.fromkeys(r for r in found if r))

passed = failed = 0
skipped = []  # (stage, test, reason)
for stage, path in runs:
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print("test.sh: %s: no ctest results (%s)" % (stage, e))
        continue
    seen = set()
    for tc in cases:
        name, status = tc.get("name"), tc.get("status")
        seen.add(name)
        skip = tc.find("skipped")
        msg = skip.get("message", "") if skip is not None else ""
        if status == "run":
            passed += 1
        elif status == "disabled":
            skipped.append((stage, name, "DISABLED"))
        elif status == "notrun" and msg.startswith("SKIP_"):
            out = tc.findtext("system-out") or ""
            skipped.append((stage, name, "; ".join(reasons(out)) or msg))
        else:  # failed, timed out, or not run for want of its executable or a fixture
            failed += 1
    if stage == "clang":
        for name in fuzz_tests:
            if name not in seen:
                skipped.append((stage, name, "not built: IDEM_FUZZ needs clang with libFuzzer"
                                " (see the configure warning)"))
for stage, why in left_out:
    for name in fuzz_tests:
        skipped.append((stage, name, why))

for stage, name, why in skipped:
    print("skipped (%s): %s: %s" % (stage, name, why))
status = 0
if rc != 0:
    print("test.sh: FAILED (exit %d)%s" % (rc, "" if failed else
          ": a step other than a test failed, see above; later stages did not run"))
if skipped and ci:
    print("test.sh: FAILED: %d test(s) skipped under CI; CI's machine (root, /dev/fuse, ext4,"
          " clang; tools/setup.sh --test installs the packages) can run every test, so a skip there"
          " means a missing prerequisite" % len(skipped))
    status = 1
print("tests: %d passed, %d failed, %d skipped" % (passed, failed, len(skipped)))
sys.exit(status)
PY
  if [ "$rc" -eq 0 ]; then
    rc=$src
  fi
  exit "$rc"
}
trap summary EXIT

tools/setup.sh --test

jobs=$(nproc)
# run_ctest STAGE DIR CTEST_ARGS...: ctest in DIR, its results recorded for the summary.
run_ctest() {
  local stage=$1 dir=$2
  shift 2
  local junit
  junit="$(cd "$dir" && pwd)/ctest-junit.xml"
  rm -f "$junit"
  runs+=("$stage=$junit")
  ctest --test-dir "$dir" --output-on-failure --no-tests=error --output-junit "$junit" \
    -j "$jobs" "$@"
}
run_suite() {
  local stage=$1 dir=$2
  shift 2
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  run_ctest "$stage" "$dir" -LE 'bench'
}

echo "== normal build (RelWithDebInfo)"
run_suite normal build -DCMAKE_BUILD_TYPE=RelWithDebInfo

echo "== sanitizer build (ASan + UBSan + LSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_suite asan build-asan -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON

echo "== clang build with libFuzzer targets (unit tests, then each fuzzer for a bounded run)"
if command -v clang >/dev/null; then
  CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Debug -DIDEM_FUZZ=ON >/dev/null
  cmake --build build-clang -j "$jobs"
  run_ctest clang build-clang -L 'unit|fuzz'
else
  echo "test.sh: no clang: the clang build and its fuzz targets are skipped"
  left_out+=("clang=no clang on PATH (tools/setup.sh --test installs it)")
fi

echo "== release build (-O3; built, not run: its warnings are errors too)"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "$jobs"
