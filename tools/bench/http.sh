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

log() { printf '[http.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] || die "no $BIN/idemd or idemctl: build first"

# ---- dependencies (idempotent) -------------------------------------------------------------
# wrk, etcd and nginx from Debian. Installing must not start system services: if the image
# has no policy-rc.d, a temporary one (exit 101) is put in place and removed afterwards.
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v nginx >/dev/null || need+=(nginx-light)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } \
    >/dev/null 2>&1 || { if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; die "apt-get install ${need[*]} failed"; }
  if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
HAVE_NGINX=1
command -v nginx >/dev/null || HAVE_NGINX=0
# UPSTREAM=python puts tests/integration/order_service.py (a small threaded Python service,
# i.e. an upstream that does some work per request) behind the proxy instead of nginx.
case "${UPSTREAM:-nginx}" in
  nginx) ;;
  python) HAVE_NGINX=0 ;;
  *) die "UPSTREAM must be nginx or python" ;;
esac

# ---- processes and cleanup -----------------------------------------------------------------
TMP=$(mktemp -d /tmp/idem-http-bench.XXXXXX)
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ] && [ -d "$TMP" ]; then
    for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done >&2
  fi
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
trap 'exit 143' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
sha() { printf '%s' "$1" | sha256sum | cut -c1-64; }
# wait_until SECONDS WHAT CMD...: poll CMD until it succeeds.
wait_until() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out waiting for $what"
    sleep 0.1
  done
}

# ---- wrk runner ------------------------------------------------------------------------------
# run_wrk NAME URL SCRIPT [ENV=...]: one bounded wrk run with --latency; records
# RPS[NAME], P50[NAME], P99[NAME] (ms) and NON2XX[NAME], ERRS[NAME] from its output.
declare -A RPS P50 P99 NON2XX ERRS
run_wrk() {
  local name=$1 url=$2 script=$3; shift 3
  local out=$TMP/wrk-$name.txt
  env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-$name" "$@" \
    timeout $((DURATION + 20)) wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 5s \
    --latency -s "$WRKDIR/$script" "$url" >"$out" 2>&1 || { cat "$out" >&2; die "wrk $name failed"; }
  sed 's/^/    /' "$out" >&2
  RPS[$name]=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out")
  P50[$name]=$(awk '$1=="50%" {print $2}' "$out" | to_ms)
  P99[$name]=$(awk '$1=="99%" {print $2}' "$out" | to_ms)
  NON2XX[$name]=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out"); NON2XX[$name]=${NON2XX[$name]:-0}
  ERRS[$name]=$(awk -F'[ ,]+' '/Socket errors:/ {print $4+$6+$8+$10}' "$out"); ERRS[$name]=${ERRS[$name]:-0}
}
# wrk prints latencies as 812.00us / 1.23ms / 1.02s: convert to ms.
to_ms() {
  awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)}
        else if (v ~ /m$/) {sub(/m$/,"",v); v*=60000} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}
        printf "%.2f", v}'
}
# verify_wrk NAME URL SCRIPT EXPECT [ENV=...]: a 1 s, 1-connection run whose response()
# checks each body for EXPECT (shows the Lua script builds valid requests); fails loudly.
verify_wrk() {
  local name=$1 url=$2 script=$3 expect=$4; shift 4
  local out=$TMP/verify-$name.txt
  env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-$name" VERIFY="$expect" "$@" \
    timeout 20 wrk -t1 -c1 -d1s -s "$WRKDIR/$script" "$url" >"$out" 2>&1 || true
  local line; line=$(grep '^VERIFY ok=' "$out" || true)
  log "check $name (expect '$expect' in every body): ${line:-no result}"
  if ! grep -q '^VERIFY ok=[1-9][0-9]* bad=0$' "$out"; then cat "$out" >&2; die "check $name failed"; fi
}

# ================================================================================================
# 1. idemd: three nodes, generated configs (as tests/integration/harness.py), proxy listeners
# ================================================================================================
TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
ADMIN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')

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

declare -A RAFT RPC HTTP PROXY
for i in 1 2 3; do
  RAFT[$i]=127.0.0.1:$(free_port); RPC[$i]=127.0.0.1:$(free_port)
  HTTP[$i]=127.0.0.1:$(free_port); PROXY[$i]=127.0.0.1:$(free_port)
done
for i in 1 2 3; do
  {
    echo "node:"
    echo "  id: $i"
    echo "  raft_address: ${RAFT[$i]}"
    echo "  rpc_address: ${RPC[$i]}"
    echo "  http_address: ${HTTP[$i]}"
    echo "  data_dir: $TMP/node$i"
    echo "cluster:"
    echo "  bootstrap:"
    for j in 1 2 3; do
      echo "    - {id: $j, raft_address: ${RAFT[$j]}, rpc_address: ${RPC[$j]}, http_address: ${HTTP[$j]}}"
    done
    echo "admin:"
    echo "  token_sha256: $(sha "$ADMIN")"
    echo "tenants:"
    echo "  - name: alpha"
    echo "    token_sha256: $(sha "$TOKEN")"
    # Proxy mode (step 4), as tests/integration/test_proxy.py's default route.
    echo "proxy:"
    echo "  - address: ${PROXY[$i]}"
    echo "    routes:"
    echo "      - methods: [POST, PUT, PATCH, DELETE]"
    echo "        path_prefix: /"
    echo "        upstream: http://127.0.0.1:$UP_PORT"
    echo "        tenant: alpha"
    echo "        lease_ms: 3000"
    echo "        ttl_ms: 600000"
    echo "        upstream_timeout_ms: 2000"
    echo "        response_headers: [content-type]"
  } >"$TMP/node$i.yaml"
done
for i in 1 2 3; do
  "$BIN/idemd" --config "$TMP/node$i.yaml" >"$TMP/node$i.log" 2>&1 </dev/null &
  PIDS+=($!)
done

CLUSTER="${RPC[1]},${RPC[2]},${RPC[3]}"
idem_leader() {
  "$BIN/idemctl" --cluster "$CLUSTER" --token "$TOKEN" --admin-token "$ADMIN" --json status 2>/dev/null \
    | python3 -c 'import json,sys; l=json.load(sys.stdin).get("leader_id"); print(l) if l else sys.exit(1)'
}
wait_until 30 "an idemd leader" idem_leader
LID=$(idem_leader)
LHTTP=${HTTP[$LID]}
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
for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
PIDS=()

# ================================================================================================
# 3. etcd 3.4 (Debian): three members, fsync on; txn create-if-absent on the leader
# ================================================================================================
declare -A ECLIENT EPEER
for i in 1 2 3; do ECLIENT[$i]=http://127.0.0.1:$(free_port); EPEER[$i]=http://127.0.0.1:$(free_port); done
INITIAL="n1=${EPEER[1]},n2=${EPEER[2]},n3=${EPEER[3]}"
for i in 1 2 3; do
  etcd --name "n$i" --data-dir "$TMP/etcd$i" \
    --listen-client-urls "${ECLIENT[$i]}" --advertise-client-urls "${ECLIENT[$i]}" \
    --listen-peer-urls "${EPEER[$i]}" --initial-advertise-peer-urls "${EPEER[$i]}" \
    --initial-cluster "$INITIAL" --initial-cluster-state new --initial-cluster-token "$RUN" \
    --logger zap --log-level warn >"$TMP/etcd$i.log" 2>&1 </dev/null &
  PIDS+=($!)
done
EPS="${ECLIENT[1]},${ECLIENT[2]},${ECLIENT[3]}"
etcd_leader() {  # prints the client URL of the member whose id is the leader id
  ETCDCTL_API=3 etcdctl --endpoints "$EPS" --command-timeout=2s endpoint status -w json 2>/dev/null \
    | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    st = e["Status"]
    if st.get("leader") and st["header"]["member_id"] == st["leader"]:
        print(e["Endpoint"]); sys.exit(0)
sys.exit(1)'
}
wait_until 30 "an etcd leader" etcd_leader
ELEADER=$(etcd_leader)
log "etcd $(etcd --version | awk 'NR==1{print $3}') leader: $ELEADER"

verify_wrk etcd_check "$ELEADER" etcd_txn.lua '"succeeded":true'
# The Lua base64 of the keys must decode to the keys: count them back by prefix with etcdctl.
n_ok=$(sed -n 's/^VERIFY ok=\([0-9]*\) .*/\1/p' "$TMP/verify-etcd_check.txt")
n_keys=$(ETCDCTL_API=3 etcdctl --endpoints "$ELEADER" get "$RUN-etcd_check-1-" --prefix --keys-only \
  | grep -c "^$RUN-etcd_check-1-[0-9]*\$" || true)
log "etcd keys under $RUN-etcd_check-1-: $n_keys (successful txns: $n_ok)"
# (one request may be in flight when wrk stops: committed, but its answer not counted)
[ "$n_keys" -ge "$n_ok" ] && [ "$n_keys" -le $((n_ok + 1)) ] \
  || die "etcd holds $n_keys keys for $n_ok txns: the Lua base64 is wrong"
log "etcd txn create-if-absent, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk etcd_txn "$ELEADER" etcd_txn.lua

# ================================================================================================
# 5. the table
# ================================================================================================
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
row() {  # row LABEL NAME
  printf '%-44s %10s %9s %9s %8s %6s\n' "$1" "${RPS[$2]}" "${P50[$2]}" "${P99[$2]}" "${NON2XX[$2]}" "${ERRS[$2]}"
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
echo "  idemd fresh claims / etcd txn:        $(ratio "${RPS[idem_fresh]}" "${RPS[etcd_txn]}")"
echo "  proxy fresh / upstream direct:        $(ratio "${RPS[proxy_fresh]}" "${RPS[up_direct]}")"
echo "  proxy replays / upstream direct:      $(ratio "${RPS[proxy_replay]}" "${RPS[up_direct]}")"
echo "  proxy fresh / idemd JSON fresh:       $(ratio "${RPS[proxy_fresh]}" "${RPS[idem_fresh]}")"
