#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz/) longer than CI's smoke pass, one after another,
# and keeps what they find: each target starts from its checked-in corpus
# (tests/fuzz/corpus/<target>/) and the seeds the build generates; the inputs it finds are
# then merged back into tests/fuzz/corpus/<target>/ with libFuzzer's -merge=1, which adds
# only those that cover something the corpus did not (smallest first), so that the corpus
# stays small and the next run, here or in CI, starts from it. Commit the new files.
#
# Usage: tools/fuzz.sh [--minutes N] [--target NAME]... [--build-dir DIR]
#   --minutes N     fuzzing time per target (default 10)
#   --target NAME   only this target (fuzz_config, ...); may be repeated
#   --build-dir DIR the clang build with -DIDEM_FUZZ=ON; configured and built when needed
#                   (default build-fuzz)
# Prints, per target, the executions, the new corpus files and the crashes. A crash (or a
# leak, timeout or out-of-memory) fails the script once every target has run; its
# reproducer and the command that replays it are printed. Targets run one at a time, each
# in one process, so that a shared machine keeps a core.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)

minutes=10
build=build-fuzz
targets=()
usage() {
  sed -n 's/^# \{0,1\}//; 9,13p' "$0" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) [ $# -ge 2 ] || usage; minutes=$2; shift 2 ;;
    --target) [ $# -ge 2 ] || usage; targets+=("$2"); shift 2 ;;
    --build-dir) [ $# -ge 2 ] || usage; build=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; usage ;;
  esac
done
case $minutes in
  '' | *[!0-9]* | 0) echo "fuzz.sh: --minutes takes a whole number of minutes, at least 1" >&2; exit 2 ;;
esac

# Every target is tests/fuzz/fuzz_<name>.c.
all=()
for f in tests/fuzz/fuzz_*.c; do
  all+=("$(basename "$f" .c)")
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
  case " ${all[*]} " in
    *" $t "*) ;;
    *) echo "fuzz.sh: no target $t (targets: ${all[*]})" >&2; exit 2 ;;
  esac
done

# The build: configured when it is not yet, refused when it is not a clang fuzz build.
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "== configuring $build (clang, -DIDEM_FUZZ=ON)"
  CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DIDEM_FUZZ=ON >/dev/null
elif ! grep -Eqi '^IDEM_FUZZ:[A-Z]*=(ON|TRUE|YES|1)$' "$build/CMakeCache.txt" ||
  ! grep -q '^CMAKE_C_COMPILER:[A-Z]*=.*clang[^/]*$' "$build/CMakeCache.txt"; then
  echo "fuzz.sh: $build is not a clang build with -DIDEM_FUZZ=ON; pick another --build-dir" >&2
  exit 2
fi
echo "== building ${targets[*]} in $build"
build=$(cd "$build" && pwd)
if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" fuzz_seeds >"$build/fuzz-build.log" 2>&1; then
  tail -n 40 "$build/fuzz-build.log" >&2
  echo "fuzz.sh: the build failed (all of it in $build/fuzz-build.log)" >&2
  exit 1
fi
seeds=$build/tests/fuzz/seeds
runs=$build/tests/fuzz/long

# The files' total size in KiB (their bytes, not the blocks they take).
kib() { find "$@" -type f -printf '%s\n' | awk '{ s += $1 } END { print int((s + 1023) / 1024) }'; }

failed=0
total_added=0
report=()
for t in "${targets[@]}"; do
  corpus=$src/tests/fuzz/corpus/$t
  work=$runs/$t
  rm -rf "$work"
  mkdir -p "$work/new" "$work/artifacts" "$corpus"
  dict=()
  if [ -f "tests/fuzz/$t.dict" ]; then
    dict=("-dict=$src/tests/fuzz/$t.dict")
  fi
  before=$(find "$corpus" -type f | wc -l)
  echo "== $t: fuzzing for $minutes min from $before corpus files (log: $work/fuzz.log)"

  # New inputs go to the first directory, work/new; the corpus and the seeds are read only.
  rc=0
  "$build/bin/$t" "${dict[@]}" -max_total_time=$((minutes * 60)) -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/new" "$corpus" "$seeds/$t" >"$work/fuzz.log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)
  if [ -z "$execs" ]; then # no final stats (killed): the last status line's count
    execs=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$work/fuzz.log" | tail -n 1)
  fi
  found=$(find "$work/new" -type f | wc -l)

  # Only the finds that add coverage to the checked-in corpus join it (none over 64 KiB).
  if [ "$found" -gt 0 ]; then
    "$build/bin/$t" -merge=1 -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$work/artifacts/merge-" "$corpus" "$work/new" >"$work/merge.log" 2>&1 || {
      echo "fuzz.sh: $t: the merge failed, see $work/merge.log" >&2
      failed=1
    }
  fi
  after=$(find "$corpus" -type f | wc -l)
  added=$((after - before))
  total_added=$((total_added + added))

  crashes=()
  while IFS= read -r -d '' a; do
    crashes+=("$a")
  done < <(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o \
    -name 'timeout-*' -o -name 'oom-*' -o -name 'merge-*' \) -print0 | sort -z)
  line="$t: ${execs:-?} executions, $found inputs found, $added new corpus files (now $after, $(kib "$corpus") KiB), ${#crashes[@]} crashes"
  echo "$line"
  report+=("$line")
  if [ ${#crashes[@]} -gt 0 ] || [ "$rc" -ne 0 ]; then
    failed=1
    if [ ${#crashes[@]} -eq 0 ]; then
      echo "fuzz.sh: $t: the fuzzer exited with $rc and left no reproducer; see $work/fuzz.log"
    fi
    for a in "${crashes[@]}"; do
      echo "  reproducer: $a"
      echo "  replay:     $build/bin/$t $a"
      report+=("  reproducer: $a" "  replay:     $build/bin/$t $a")
    done
    grep -m 3 -E '^==[0-9]+== ?ERROR|runtime error|^SUMMARY' "$work/fuzz.log" | sed 's/^/  /' || true
  fi
done

echo "== summary ($minutes min per target)"
printf '%s\n' "${report[@]}"
total=$(kib "$src/tests/fuzz/corpus")
echo "corpus: tests/fuzz/corpus holds $(find "$src/tests/fuzz/corpus" -type f | wc -l) files, $total KiB"
big=$(find "$src/tests/fuzz/corpus" -type f -size +64k)
if [ -n "$big" ]; then
  echo "fuzz.sh: files over 64 KiB in the corpus (keep it small):"
  echo "$big" | sed 's/^/  /'
fi
if [ "$total" -gt 4096 ]; then
  echo "fuzz.sh: the corpus is over 4 MiB; minimise it (see -merge=1 in this script)"
fi
if [ "$failed" -ne 0 ]; then
  echo "fuzz.sh: FAILED: a fuzzer crashed or a merge failed (see above)"
  exit 1
fi
echo "fuzz.sh: done; $total_added new corpus files in tests/fuzz/corpus (commit them)"
