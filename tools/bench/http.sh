#!/usr/bin/env bash
# http.sh: HTTP throughput and latency of idemd's gateway, next to etcd and a bare upstream.
# A benchmark, not a test: it asserts nothing beyond "the load did what it says".
#
#   tools/bench/http.sh            (root on Debian 12; needs build/bin from a normal build)
#
# One run, all on 127.0.0.1 with free ports, in a temp dir, bounded to ~4 minutes:
#   1. a 3-node idemd cluster (fsync on, the default); wait for a leader via idemctl.
#   2. wrk on the leader's JSON API, POST /v1/claims: fresh keys (each one Raft write),
#      then replays of a few completed keys (no write).
#   3. a 3-node etcd (Debian's 3.4, fsync on): wrk on the leader's JSON gateway,
#      POST /v3/kv/txn create-if-absent with fresh keys (each one Raft write).
#   4. proxy mode: a trivial nginx (`return 201`) as upstream; wrk straight at it, then through
#      the idemd leader's proxy listener with fresh keys, then replays.
#   5. one table with requests/s, p50/p99 and the ratios.
# Order of execution: 1, 2, 4 (idemd and the upstream), then idemd is stopped and 3 runs
# with etcd alone on the machine, so neither system competes with the other's idle nodes.
# Every process started is killed by PID on exit; the temp dir is removed.
# Env: DURATION (seconds per wrk run, default 10), CONNS (64), THREADS (2),
#      UPSTREAM (nginx, the default, or python: tests/integration/order_service.py).
set -euo pipefail

# The whole run is bounded: rerun ourselves under timeout(1) (TERM -> trap -> cleanup).
# Each step's own timeout runs with --foreground, so that it stays in our process group
# and the TERM ends the step at once (bash runs the trap only once the step is over).
if [ -z "${HTTP_BENCH_BOUNDED:-}" ]; then
  HTTP_BENCH_BOUNDED=1 exec timeout -s TERM 270 "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${IDEM_BIN_DIR:-$ROOT/build/bin}
WRKDIR=$ROOT/tools/bench/wrk
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
NKEYS=16                                   # size of the replayed key sets
FP=$(printf 'bench' | sha256sum | cut -c1-64)   # the fingerprint of every JSON API claim
RUN=b$(date +%s)-$$                        # prefix that makes every key of this run new

BENCH_NAME=http.sh
. "$ROOT/tools/bench/lib.sh"

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] || die "no $BIN/idemd or idemctl: build first"

# wrk, etcd and nginx from Debian.
bench_install pkill:procps wrk:wrk etcd:etcd-server etcdctl:etcd-client nginx:nginx-light curl:curl
HAVE_NGINX=1
command -v nginx >/dev/null || HAVE_NGINX=0
# UPSTREAM=python puts tests/integration/order_service.py (a small threaded Python service,
# i.e. an upstream that does some work per request) behind the proxy instead of nginx.
case "${UPSTREAM:-nginx}" in
  nginx) ;;
  python) HAVE_NGINX=0 ;;
  *) die "UPSTREAM must be nginx or python" ;;
esac

bench_tmp idem-http-bench

# The upstream of step 4 is started first: the proxy routes name it.
UP_PORT=$(free_port)
if [ $HAVE_NGINX = 1 ]; then
  UPSTREAM_KIND="nginx (return 201, 1 process)"
  mkdir -p "$TMP/nginx"
  cat >"$TMP/nginx/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx/body;
  proxy_temp_path $TMP/nginx/proxy;
  fastcgi_temp_path $TMP/nginx/fastcgi;
  uwsgi_temp_path $TMP/nginx/uwsgi;
  scgi_temp_path $TMP/nginx/scgi;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$UP_PORT;
    location / { default_type application/json; return 201 '{"id":1}'; }
  }
}
EOF
  nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" >>"$TMP/nginx.log" 2>&1 &
  PIDS+=($!)
else
  UPSTREAM_KIND="tests/integration/order_service.py (Python, threaded)"
  python3 "$ROOT/tests/integration/order_service.py" --port "$UP_PORT" --log "$TMP/orders.jsonl" \
    >"$TMP/orders.log" 2>&1 &
  PIDS+=($!)
fi
wait_until 20 "the upstream on $UP_PORT" curl -sf -o /dev/null -X POST "http://127.0.0.1:$UP_PORT/orders" \
  -H 'Content-Type: application/json' -d '{"amount":100,"currency":"EUR"}'
log "upstream: $UPSTREAM_KIND on 127.0.0.1:$UP_PORT"

# Proxy mode (step 4), as tests/integration/test_proxy.py's default route.
cat >"$TMP/routes.yaml" <<EOF
      - methods: [POST, PUT, PATCH, DELETE]
        path_prefix: /
        upstream: http://127.0.0.1:$UP_PORT
        tenant: alpha
        lease_ms: 3000
        ttl_ms: 600000
        upstream_timeout_ms: 2000
        response_headers: [content-type]
EOF
idem_start "$TMP/routes.yaml"
log "idemd leader: node $LID, JSON API http://$LHTTP, proxy http://${PROXY[$LID]}"

# ================================================================================================
# 2. idemd JSON API: POST /v1/claims, fresh keys then replays
# ================================================================================================
claim() {  # claim KEY -> prints the response body
  curl -s -X POST "http://$LHTTP/v1/claims" -H "Authorization: Bearer $TOKEN" \
    -H "Idempotency-Key: $1" -H 'Content-Type: application/json' -d "{\"fingerprint\": \"$FP\"}"
}
wait_until 20 "the leader's gateway to acquire a claim" sh -c "curl -s -X POST http://$LHTTP/v1/claims \
  -H 'Authorization: Bearer $TOKEN' -H 'Idempotency-Key: $RUN-probe' -H 'Content-Type: application/json' \
  -d '{\"fingerprint\": \"$FP\"}' | grep -q '\"acquired\"'"
# The replay set: NKEYS keys claimed and completed with a stored 201.
for ((k = 0; k < NKEYS; k++)); do
  key=$RUN-idem_replay-rep-$k
  tok=$(claim "$key" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])') \
    || die "claim of $key failed"
  curl -sf -o /dev/null -X POST "http://$LHTTP/v1/claims/$key/complete" -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' \
    -d "{\"token\": $tok, \"response\": {\"status\": 201, \"headers\": {\"content-type\": \"application/json\"}, \"body\": \"{\\\"id\\\": $k}\"}}" \
    || die "complete of $key failed"
done
curl -si -X POST "http://$LHTTP/v1/claims" -H "Authorization: Bearer $TOKEN" \
  -H "Idempotency-Key: $RUN-idem_replay-rep-0" -d "{\"fingerprint\": \"$FP\"}" \
  | grep -qi '^idempotency-replayed: true' || die "a completed key is not replayed"

verify_wrk idem_check "http://$LHTTP" idem_claim.lua '"acquired"' IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh
log "idemd JSON API, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk idem_fresh "http://$LHTTP" idem_claim.lua IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh
log "idemd JSON API, replays of $NKEYS completed keys"
run_wrk idem_replay "http://$LHTTP" idem_claim.lua IDEM_TOKEN="$TOKEN" FP="$FP" MODE=replay NKEYS=$NKEYS

# ================================================================================================
# 4. proxy mode (before etcd, while only idemd and the upstream run)
# ================================================================================================
LPROXY=${PROXY[$LID]}
# The leader's proxy is ready when a pass-through GET reaches the upstream.
wait_until 30 "the leader's proxy" sh -c "curl -s -o /dev/null -w '%{http_code}' http://$LPROXY/ready-probe | grep -q '^20'"
order() {  # order KEY -> headers + body through the leader's proxy
  curl -si -X POST "http://$LPROXY/orders" -H "Idempotency-Key: $1" -H 'Content-Type: application/json' \
    -d '{"amount":100,"currency":"EUR"}'
}
for ((k = 0; k < NKEYS; k++)); do
  order "$RUN-proxy_replay-rep-$k" | head -1 | grep -q ' 201' || die "proxy request $k did not answer 201"
done
order "$RUN-proxy_replay-rep-0" | grep -qi '^idempotency-replayed: true' || die "the proxy does not replay"

log "upstream direct: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk up_direct "http://127.0.0.1:$UP_PORT" proxy_order.lua MODE=fresh
verify_wrk proxy_check "http://$LPROXY" proxy_order.lua '"id"' MODE=fresh
log "through the idemd proxy, fresh keys"
run_wrk proxy_fresh "http://$LPROXY" proxy_order.lua MODE=fresh
log "through the idemd proxy, replays of $NKEYS keys"
run_wrk proxy_replay "http://$LPROXY" proxy_order.lua MODE=replay NKEYS=$NKEYS

# idemd is done: stop it (and the upstream) so that etcd has the machine to itself.
stop_all

# ================================================================================================
# 3. etcd 3.4 (Debian): three members, fsync on; txn create-if-absent on the leader
# ================================================================================================
etcd_start
etcd_check
log "etcd txn create-if-absent, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk etcd_txn "$ELEADER" etcd_txn.lua

# ================================================================================================
# 5. the table
# ================================================================================================
row() {  # row LABEL NAME
  printf '%-44s %10s %9s %9s %8s %6s\n' "$1" "${OPS[$2]}" "${P50[$2]}" "${P99[$2]}" "${NON2XX[$2]}" "${ERRS[$2]}"
}
echo
echo "== idemd HTTP gateway benchmark: wrk -t$THREADS -c$CONNS -d${DURATION}s, $(nproc) cores, loopback, fsync on =="
echo "   upstream: $UPSTREAM_KIND"
printf '%-44s %10s %9s %9s %8s %6s\n' "run" "req/s" "p50 ms" "p99 ms" "non-2xx" "errs"
row "idemd JSON API claim, fresh keys" idem_fresh
row "idemd JSON API claim, replays ($NKEYS keys)" idem_replay
row "etcd 3.4 txn create-if-absent, fresh keys" etcd_txn
row "upstream direct" up_direct
row "upstream via idemd proxy, fresh keys" proxy_fresh
row "upstream via idemd proxy, replays ($NKEYS keys)" proxy_replay
echo
echo "ratios (req/s):"
echo "  idemd fresh claims / etcd txn:        $(ratio "${OPS[idem_fresh]}" "${OPS[etcd_txn]}")"
echo "  proxy fresh / upstream direct:        $(ratio "${OPS[proxy_fresh]}" "${OPS[up_direct]}")"
echo "  proxy replays / upstream direct:      $(ratio "${OPS[proxy_replay]}" "${OPS[up_direct]}")"
echo "  proxy fresh / idemd JSON fresh:       $(ratio "${OPS[proxy_fresh]}" "${OPS[idem_fresh]}")"
