#!/usr/bin/env bash
# Quick start: installs what idemd needs, builds it, and runs a local three-node cluster on
# 127.0.0.1 until Ctrl-C.
#
#   tools/quickstart.sh           start (a second run reuses the data: restart from disk)
#   tools/quickstart.sh --fresh   wipe ./.idem first
#   tools/quickstart.sh --upstream http://127.0.0.1:9999
#                                 also run proxy mode: node N serves a proxy listener on
#                                 127.0.0.1:810N that routes POST/PUT/PATCH/DELETE under "/"
#                                 to the upstream for tenant demo (every node's proxy serves:
#                                 followers forward to the leader with the cluster secret)
#   tools/quickstart.sh --port-base B
#                                 other ports, for a second cluster on the host or ports in
#                                 use: node N (1-3) gets the binary RPC on B+N, HTTP on
#                                 B+1000+N, its proxy listener on B+1100+N and Raft on
#                                 B+2000+N. B is 1024 to 63532; the default, 7000, gives the
#                                 ports below. Data made with one base stays with it: a run
#                                 with another refuses it (pass --fresh).
#   tools/quickstart.sh --tls     serve the binary RPC and Raft over mutual TLS (tls.rpc,
#                                 tls.raft), and HTTP (the gateway, and the proxy listeners
#                                 with --upstream) over HTTPS: a CA, a certificate for the
#                                 nodes (IP 127.0.0.1; server and client use) and one for
#                                 idemctl are made in .idem/pki with openssl (kept across
#                                 runs); .idem/env then also sets IDEM_TLS_CA, IDEM_TLS_CERT
#                                 and IDEM_TLS_KEY. A run without --tls drops them again, and
#                                 sends the cluster secret in clear between the loopback
#                                 addresses (rpc.insecure_cluster_secret).
#
# Fixed, documented defaults that scripts may rely on: node N (1-3) listens for Raft on
# 127.0.0.1:900N, for the binary RPC on 127.0.0.1:700N and for HTTP (JSON API, health, metrics) on
# 127.0.0.1:800N (HTTPS with --tls), and with --upstream for proxy requests on 127.0.0.1:810N
# (--port-base moves them all); its data is in .idem/nodeN, its log in .idem/nodeN.log, its PID in
# .idem/nodeN.pid. .idem/env holds IDEM_CLUSTER, IDEM_TOKEN (tenant "demo") and
# IDEM_ADMIN_TOKEN as shell assignments: `. .idem/env && build/bin/idemctl status`.
# .idem/cluster.secret (mode 600) is the cluster secret every node's rpc.cluster_secret_file
# names; .idem/raft.secret (mode 600) the one that authenticates their Raft connections
# (raft.secret_file). A node restarted by hand, with the command the script prints, writes its
# PID to .idem/nodeN.pid: Ctrl-C stops it too. The script runs until Ctrl-C, or until no node
# is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
tls=0
upstream=
base=7000
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh) fresh=1 ;;
    --port-base)
      [ $# -ge 2 ] || { echo "quickstart: --port-base needs a number" >&2; exit 2; }
      base=$2; shift ;;
    --port-base=*) base=${1#--port-base=} ;;
    --upstream)
      [ $# -ge 2 ] || { echo "quickstart: --upstream needs a URL" >&2; exit 2; }
      upstream=$2; shift ;;
    --upstream=*) upstream=${1#--upstream=} ;;
    --tls) tls=1 ;;
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "quickstart: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$upstream" in
  ''|http://*) ;;
  *) echo "quickstart: --upstream must be an http:// URL" >&2; exit 2 ;;
esac
# The highest port is B+2003 (Raft of node 3); below 1024 a port needs root.
case "$base" in
  ''|*[!0-9]*|0?*) echo "quickstart: --port-base must be a number from 1024 to 63532, got '$base'" >&2; exit 2 ;;
esac
if [ "${#base}" -gt 5 ] || [ "$base" -lt 1024 ] || [ "$base" -gt 63532 ]; then
  echo "quickstart: --port-base must be a number from 1024 to 63532, got '$base'" >&2
  exit 2
fi
# Node N's ports: RPC B+N, HTTP B+1000+N, proxy B+1100+N, Raft B+2000+N.
rpcPort() { echo $((base + $1)); }
httpPort() { echo $((base + 1000 + $1)); }
proxyPort() { echo $((base + 1100 + $1)); }
raftPort() { echo $((base + 2000 + $1)); }

tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

dir=.idem
# Node N's PID from .idem/nodeN.pid when that process is alive and is node N's idemd (a
# node restarted by hand, as the message at the end shows, writes its own there; the PID
# of a node that died may have gone to another process since).
nodePid() {
  local p
  p=$(cat "$dir/node$1.pid" 2>/dev/null) || return 0
  case "$p" in ''|*[!0-9]*) return 0 ;; esac
  if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "idemd .*node$1\.yaml"; then
    echo "$p"
  fi
  return 0
}
# The nodes running now.
running() {
  local n
  for n in 1 2 3; do nodePid "$n"; done
}
for n in 1 2 3; do
  p=$(nodePid "$n")
  if [ -n "$p" ]; then
    echo "quickstart: node $n is already running (PID $p); stop it first" >&2
    exit 1
  fi
done
[ "$fresh" = 1 ] && rm -rf "$dir"
mkdir -p "$dir"
# The nodes' data holds their Raft configuration, with the addresses of the run that made
# it: another port base would leave each node looking for its peers at the old ports.
made_with=$(cat "$dir/port-base" 2>/dev/null || echo 7000)
if [ -d "$dir/node1" ] && [ "$made_with" != "$base" ]; then
  echo "quickstart: the data in $dir was made with --port-base $made_with; run with" \
       "--port-base $made_with, or pass --fresh to start over with $base" >&2
  exit 2
fi
echo "$base" > "$dir/port-base"
cluster="127.0.0.1:$(rpcPort 1),127.0.0.1:$(rpcPort 2),127.0.0.1:$(rpcPort 3)"

if [ ! -f "$dir/env" ]; then
  token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  {
    echo "IDEM_CLUSTER=$cluster"
    echo "IDEM_TOKEN=$token"
    echo "IDEM_ADMIN_TOKEN=$admin"
    echo "export IDEM_CLUSTER IDEM_TOKEN IDEM_ADMIN_TOKEN"
  } > "$dir/env"
  chmod 600 "$dir/env"
fi
if [ ! -s "$dir/cluster.secret" ]; then
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/cluster.secret")
fi
if [ ! -s "$dir/raft.secret" ]; then
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/raft.secret")
fi
# TLS: the PKI once, and the env's TLS lines matching this run. Without TLS the cluster
# secret may go in clear only because every address here is a loopback one.
tls_yaml=
secret_yaml="  insecure_cluster_secret: true"
scheme=http
curl_ca=
if [ "$tls" = 1 ]; then
  pki=$PWD/$dir/pki
  if [ ! -s "$pki/client.key" ]; then
    mkdir -p "$pki"
    (
      cd "$pki"
      umask 077
      ossl() { openssl "$@" >/dev/null 2>&1 || { echo "quickstart: openssl $1 failed" >&2; exit 1; }; }
      ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
        -out ca.crt -days 365 -subj "/CN=idem quickstart CA"
      printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > node.ext
      printf 'extendedKeyUsage=clientAuth\n' > client.ext
      for name in node client; do
        ossl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$name.key" \
          -out "$name.csr" -subj "/CN=idem quickstart $name"
        ossl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
          -out "$name.crt" -days 365 -extfile "$name.ext"
      done
    )
  fi
  tls_yaml="tls: {cert_file: $pki/node.crt, key_file: $pki/node.key, ca_file: $pki/ca.crt, rpc: true, raft: true, http: true${upstream:+, proxy: true}}"
  secret_yaml="  # over TLS (tls.rpc)"
  scheme=https
  curl_ca=" --cacert $dir/pki/ca.crt"
fi
grep -v '^IDEM_TLS\|^export IDEM_TLS' "$dir/env" |
  sed "s/^IDEM_CLUSTER=.*/IDEM_CLUSTER=$cluster/" > "$dir/env.tmp" || true
if [ "$tls" = 1 ]; then
  {
    echo "IDEM_TLS_CA=$pki/ca.crt"
    echo "IDEM_TLS_CERT=$pki/client.crt"
    echo "IDEM_TLS_KEY=$pki/client.key"
    echo "export IDEM_TLS_CA IDEM_TLS_CERT IDEM_TLS_KEY"
  } >> "$dir/env.tmp"
fi
chmod 600 "$dir/env.tmp"
mv "$dir/env.tmp" "$dir/env"
unset IDEM_TLS_CA IDEM_TLS_CERT IDEM_TLS_KEY
# shellcheck disable=SC1091
. "$dir/env"
token_hash=$(printf %s "$IDEM_TOKEN" | sha256sum | cut -d' ' -f1)
admin_hash=$(printf %s "$IDEM_ADMIN_TOKEN" | sha256sum | cut -d' ' -f1)

bootstrap=
for n in 1 2 3; do
  bootstrap="$bootstrap
    - {id: $n, raft_address: 127.0.0.1:$(raftPort $n), rpc_address: 127.0.0.1:$(rpcPort $n), http_address: 127.0.0.1:$(httpPort $n)}"
done
for n in 1 2 3; do
  cat > "$dir/node$n.yaml" <<YAML
# Generated by tools/quickstart.sh; see tools/idemd.example.yaml for every field.
node:
  id: $n
  raft_address: 127.0.0.1:$(raftPort $n)
  rpc_address: 127.0.0.1:$(rpcPort $n)
  http_address: 127.0.0.1:$(httpPort $n)
  data_dir: $PWD/$dir/node$n
cluster:
  bootstrap:$bootstrap
raft:
  secret_file: $PWD/$dir/raft.secret
rpc:
  cluster_secret_file: $PWD/$dir/cluster.secret
$secret_yaml
admin:
  token_sha256: $admin_hash
tenants:
  - name: demo
    token_sha256: $token_hash
$tls_yaml
YAML
  if [ -n "$upstream" ]; then
    cat >> "$dir/node$n.yaml" <<YAML
proxy:
  - address: 127.0.0.1:$(proxyPort $n)
    routes:
      - {methods: [POST, PUT, PATCH, DELETE], path_prefix: /, upstream: "$upstream", tenant: demo}
YAML
  fi
done

pids=()
stop() {
  trap - INT TERM
  echo
  echo "quickstart: stopping the cluster"
  local all p
  all=$(running)
  for p in $all; do kill -TERM "$p" 2>/dev/null || true; done
  # SIGTERM stops a node within seconds; those started by hand are not our children.
  for _ in $(seq 1 300); do
    [ -z "$(for p in $all; do kill -0 "$p" 2>/dev/null && echo "$p"; done)" ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -f "$dir"/node?.pid
  exit 0
}
trap stop INT TERM

for n in 1 2 3; do
  build/bin/idemd --config "$dir/node$n.yaml" >>"$dir/node$n.log" 2>&1 &
  pids+=($!)
  echo $! > "$dir/node$n.pid"
done

# Wait (bounded) until the cluster has a leader.
for _ in $(seq 1 100); do
  if build/bin/idemctl --json status 2>/dev/null | grep -q '"leader_id": [0-9]'; then
    break
  fi
  sleep 0.2
done
build/bin/idemctl status || true

cat <<MSG

A three-node idemd cluster is running (PIDs ${pids[*]}; logs in $dir/node*.log).
Tenant "demo"; its token and the admin token are in $dir/env. Try:

  . $dir/env
  build/bin/idemctl claim order-1 --fingerprint $(printf %064d 1)
  build/bin/idemctl complete order-1 --token <token from the claim> --status 201 --body '{"id":1}'
  build/bin/idemctl claim order-1 --fingerprint $(printf %064d 1)     # replay
  build/bin/idemctl claim order-1 --fingerprint $(printf %064d 2)     # mismatch
  build/bin/idemctl status

MSG
if [ -n "$upstream" ]; then
  cat <<MSG
Proxy mode: 127.0.0.1:$(proxyPort 1)-$(proxyPort 3) forward to $upstream for tenant demo (any node):
  curl -i$curl_ca -X POST $scheme://127.0.0.1:$(proxyPort 1)/orders -H 'Idempotency-Key: order-1' \\
       -H 'Content-Type: application/json' -d '{"sku":"a"}'     # again on $(proxyPort 2): a replay

MSG
fi
if [ "$tls" = 1 ]; then
  cat <<MSG
TLS: the RPC listeners ($(rpcPort 1)-$(rpcPort 3)) and the Raft ports ($(raftPort 1)-$(raftPort 3)) speak mutual TLS; $dir/env points
idemctl and idem-bench at $dir/pki (CA, client certificate and key). Followers forward to
the leader over TLS too. HTTP is HTTPS ($(httpPort 1)-$(httpPort 3)${upstream:+, $(proxyPort 1)-$(proxyPort 3)}):
  curl --cacert $dir/pki/ca.crt https://127.0.0.1:$(httpPort 1)/readyz

MSG
fi
cat <<MSG
To see a node fail and come back (node 1 here; \`idemctl status\` meanwhile):
  kill -9 \$(cat $dir/node1.pid)
  build/bin/idemd --config $dir/node1.yaml >>$dir/node1.log 2>&1 & echo \$! >$dir/node1.pid

Ctrl-C stops the nodes (those restarted so too); a second run restarts them from their data.
MSG
# Until Ctrl-C, or until no node is left running (each stopped or killed, none restarted).
while [ -n "$(running)" ]; do
  sleep 1 &
  wait $! || true
done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
rm -f "$dir"/node?.pid
echo "quickstart: no node is running any more (logs in $dir/node*.log)"
