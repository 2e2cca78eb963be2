#!/bin/sh
# unit.core_deps: the deterministic core (idem_core, server/CMakeLists.txt) depends on
# protobuf-c and xxhash only, reads no clock and starts no thread.
#   core_deps.sh NM ARCHIVE "LINK_LIBRARIES" CORE_ALONE
# 1. The target's link interface is exactly idem_proto (protobuf-c) and xxhash.
# 2. Every symbol the archive leaves undefined is its own, protobuf-c's (protobuf_c_*,
#    idem__* of the generated code, arena_* of proto/arena.c, the allocator commands are
#    decoded into), xxhash's (XXH*), a sanitizer's or compiler's (the fuzz
#    build's coverage counters, __sancov_*, included), or one of
#    the libc functions listed below: no pthread_*, uv_*, yaml_*, json_*, EVP_*/OpenSSL,
#    clock_gettime, time, gettimeofday, getenv, rand... A new libc function the core needs
#    must be added here, on purpose.
# 3. CORE_ALONE, a program linked against idem_core alone, runs (core_alone.c).
set -eu
nm=$1 archive=$2 libs=$3 alone=$4

want="idem_proto;PkgConfig::XXHASH"
if [ "$libs" != "$want" ]; then
    echo "idem_core links [$libs], want [$want]" >&2
    exit 1
fi

libc='abort assert __assert_fail calloc fprintf fputs fwrite free madvise malloc memcmp memcpy
      memmove memset mmap mremap munmap qsort realloc stderr strchr strcmp strlen strncmp
      strnlen __stack_chk_fail __fprintf_chk __memcpy_chk __memset_chk _GLOBAL_OFFSET_TABLE_'
defined=$("$nm" --defined-only "$archive" | awk 'NF == 3 { print $3 }' | sort -u)
bad=$("$nm" -u "$archive" | awk 'NF == 2 { print $2 }' | sort -u | while read -r sym; do
    if printf '%s\n' "$defined" | grep -qx -- "$sym"; then
        continue
    fi
    case "$sym" in
    protobuf_c_* | idem__* | arena_init | arena_reset | arena_close | XXH* | __asan_* | __ubsan_* | __sanitizer_* | __lsan_* | \
        __tsan_* | __msan_* | __gcov_* | __llvm_* | __sancov_* | __start___sancov_* | \
        __stop___sancov_*) continue ;;
    esac
    for ok in $libc; do
        if [ "$sym" = "$ok" ]; then
            continue 2
        fi
    done
    echo "$sym"
done)
if [ -n "$bad" ]; then
    echo "idem_core uses symbols outside protobuf-c, xxhash and the allowed libc calls:" >&2
    printf '  %s\n' $bad >&2
    exit 1
fi

"$alone"
echo "idem_core: links protobuf-c and xxhash only; no clock, thread or other library symbol"
