#!/bin/sh
# in_netns.sh COMMAND...: runs COMMAND in a network namespace of its own, with only a
# loopback interface (up): a test whose nodes bind a wildcard address (0.0.0.0, [::]) binds
# it there, where nothing but the test reaches it. Needs root (unshare -n); without it, says
# "skipped '...'" (the ctest's SKIP_REGULAR_EXPRESSION) and exits 0.
if ! unshare -n true 2>/dev/null; then
    echo "skipped 'needs root: a private network namespace (unshare -n) for a wildcard bind'"
    exit 0
fi
exec unshare -n -- sh -c 'ip link set lo up && exec "$@"' in_netns "$@"
