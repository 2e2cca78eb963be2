/* metrics: GET /metrics, the Prometheus text exposition (docs/metrics.md). The series are a
 * table of families (name, type, help, and where each sample's value is), rendered by one
 * loop; a family whose samples depend on the node (routes and statuses seen, outcomes,
 * transports, tenants, histogram buckets) has a writer of its own. Values are read once per
 * answer (struct snap), on the loop thread: no locks. Label values are fixed names, numbers,
 * the build's version and tenant names ([A-Za-z0-9._-], config.h), safe in a label as they
 * are. */
#include "gateway_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc_self.h"
#include "reload.h"
#include "rpc.h"
#include "service.h"

/* The project's version (CMakeLists.txt: project(... VERSION), given by server/CMakeLists.txt). */
#ifndef IDEM_BUILD_VERSION
#error "IDEM_BUILD_VERSION is not defined"
#endif

/* What one answer reads, taken at its start. */
struct snap {
    const struct http_server *h;
    struct service_info si;
    struct rpc_stats rs;
    struct cluster_io_counters io;
    struct service_stats ss;
    struct reload_stats reload;
    uint64_t records; /* si.fsm.records without the released markers */
    uint64_t connections, connections_refused, refused_address; /* the gateway's (httpMetrics) */
    uint64_t forwards_moved;                   /* the gateway's (struct httpMetrics) */
    uint64_t is_leader, has_leader;            /* this node leads / knows a leader: 0 or 1 */
    struct proc_self ps;
};

/* The offset of a uint64_t field of struct snap (any other type does not compile). */
#define U64(field)                                                                               \
    (offsetof(struct snap, field) + 0 * sizeof(_Generic(((struct snap *)0)->field, uint64_t: 1)))

/* One sample of a family with fixed samples: its label's value (NULL: the family's one
 * sample, without labels) and where its value is in struct snap. */
struct sample {
    const char *value;
    size_t off;
};

#define FAMILY_SAMPLES_MAX 8

/* One metric family: its HELP and TYPE lines, then its samples, written by `write` or else
 * the fixed ones (`label` = samples[i].value each, or one sample without labels). */
struct family {
    const char *name, *type, *help;
    void (*write)(struct textBuf *b, const struct family *f, const struct snap *s);
    const char *label;
    struct sample samples[FAMILY_SAMPLES_MAX];
    size_t arg; /* for write: which of a tenant's figures */
};

static uint64_t snapU64(const struct snap *s, size_t off)
{
    uint64_t v;
    memcpy(&v, (const char *)s + off, sizeof(v));
    return v;
}

/* ---- writers of families whose samples depend on the node ----------------------------- */

#define N_TRANSPORTS 2

/* The data-plane figures (reqstats.h) of transport k: the gateway's (http), the RPC
 * listener's (rpc). */
static const struct reqstats *transport(const struct snap *s, size_t k, const char **name)
{
    *name = k == 0 ? "http" : "rpc";
    return k == 0 ? &s->h->m.req : &s->rs.requests;
}

/* One series of a Prometheus histogram (after its HELP and TYPE lines): buckets[i] (not
 * cumulative) counts observations up to bounds[i] seconds; count includes those above the
 * last bound; sum in seconds. labels: e.g. transport="rpc", or NULL. */
static void tbHistogramSeries(struct textBuf *b, const char *name, const char *labels,
                              const double bounds[], const uint64_t buckets[], size_t n,
                              uint64_t count, double sum)
{
    const char *l = labels != NULL ? labels : "", *sep = labels != NULL ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += buckets[i];
        gateway_tb_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, l, sep, bounds[i],
                          (unsigned long long)cum);
    }
    gateway_tb_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, l, sep,
                      (unsigned long long)count);
    if (labels != NULL) {
        gateway_tb_printf(b, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, l, sum, name, l,
                          (unsigned long long)count);
    } else {
        gateway_tb_printf(b, "%s_sum %.6f\n%s_count %llu\n", name, sum, name,
                          (unsigned long long)count);
    }
}

/* By route and status, those seen. */
static void writeHttpRequests(struct textBuf *b, const struct family *f, const struct snap *s)
{
    const struct httpMetrics *m = &s->h->m;
    for (int r = 0; r < R_N; r++) {
        for (int st = 100; st < 600; st++) {
            if (m->http[r][st]) {
                gateway_tb_printf(b, "%s{route=\"%s\",status=\"%d\"} %llu\n", f->name,
                                  gateway_route_names[r], st, (unsigned long long)m->http[r][st]);
            }
        }
    }
}

/* By outcome and transport. */
static void writeRequests(struct textBuf *b, const struct family *f, const struct snap *s)
{
    for (size_t k = 0; k < N_TRANSPORTS; k++) {
        const char *tn;
        const struct reqstats *r = transport(s, k, &tn);
        for (int o = 1; o < REQSTATS_OUTCOMES; o++) {
            gateway_tb_printf(b, "%s{outcome=\"%s\",transport=\"%s\"} %llu\n", f->name,
                              gateway_outcome_names[o], tn, (unsigned long long)r->outcomes[o]);
        }
    }
}

/* By transport. */
static void writeFailClosed(struct textBuf *b, const struct family *f, const struct snap *s)
{
    for (size_t k = 0; k < N_TRANSPORTS; k++) {
        const char *tn;
        const struct reqstats *r = transport(s, k, &tn);
        gateway_tb_printf(b, "%s{transport=\"%s\"} %llu\n", f->name, tn,
                          (unsigned long long)r->fail_closed);
    }
}

/* A histogram by transport. */
static void writeClaimDuration(struct textBuf *b, const struct family *f, const struct snap *s)
{
    double bounds[REQSTATS_BUCKETS];
    for (size_t i = 0; i < REQSTATS_BUCKETS; i++) {
        bounds[i] = reqstats_bound(i);
    }
    for (size_t k = 0; k < N_TRANSPORTS; k++) {
        const char *tn;
        const struct reqstats *r = transport(s, k, &tn);
        char labels[32];
        snprintf(labels, sizeof(labels), "transport=\"%s\"", tn);
        tbHistogramSeries(b, f->name, labels, bounds, r->claim_buckets, REQSTATS_BUCKETS,
                          r->claim_count, r->claim_sum);
    }
}

/* By the outcome this node answered. */
static void writeForwarded(struct textBuf *b, const struct family *f, const struct snap *s)
{
    for (int o = 1; o < REQSTATS_OUTCOMES; o++) {
        gateway_tb_printf(b, "%s{outcome=\"%s\"} %llu\n", f->name, gateway_outcome_names[o],
                          (unsigned long long)s->rs.forwarded[o]);
    }
}

/* A histogram without labels; the last of io's buckets has no bound: it counts in +Inf (the
 * count) only. */
static void writeAppendDuration(struct textBuf *b, const struct family *f, const struct snap *s)
{
    double bounds[CLUSTER_APPEND_BUCKETS - 1];
    for (size_t i = 0; i + 1 < CLUSTER_APPEND_BUCKETS; i++) {
        bounds[i] = (double)CLUSTER_APPEND_BOUND_US(i) / 1e6;
    }
    tbHistogramSeries(b, f->name, NULL, bounds, s->si.cluster.append_buckets,
                      CLUSTER_APPEND_BUCKETS - 1, s->si.cluster.append_count,
                      (double)s->si.cluster.append_sum_us / 1e6);
}

/* Seconds, from microseconds. */
static void writeAppendOldest(struct textBuf *b, const struct family *f, const struct snap *s)
{
    gateway_tb_printf(b, "%s %.6f\n", f->name, (double)s->si.cluster.append_oldest_us / 1e6);
}

/* By tenant: its figure f->arg of service_tenant_pending (pending, queued, refused). */
static void writeTenant(struct textBuf *b, const struct family *f, const struct snap *s)
{
    const struct http_server *h = s->h;
    for (size_t i = 0; i < h->cfg->n_tenants; i++) {
        uint64_t v[3] = {0, 0, 0};
        service_tenant_pending(h->svc, i, &v[0], &v[1], &v[2]);
        gateway_tb_printf(b, "%s{tenant=\"%s\"} %llu\n", f->name, h->cfg->tenants[i].name,
                          (unsigned long long)v[f->arg]);
    }
}

/* By tenant: its usage (fsm_tenant_usage) or its quota (0: unlimited), f->arg: records,
 * bytes, quota of records, quota of bytes. */
static void writeTenantUsage(struct textBuf *b, const struct family *f, const struct snap *s)
{
    const struct http_server *h = s->h;
    for (size_t i = 0; i < h->cfg->n_tenants; i++) {
        const struct config_tenant *t = &h->cfg->tenants[i];
        uint64_t v[4] = {0, 0, t->max_records, t->max_bytes};
        if (f->arg < 2) {
            service_tenant_usage(h->svc, t->name, &v[0], &v[1]);
        }
        gateway_tb_printf(b, "%s{tenant=\"%s\"} %llu\n", f->name, t->name,
                          (unsigned long long)v[f->arg]);
    }
}

static void writeBuildInfo(struct textBuf *b, const struct family *f, const struct snap *s)
{
    (void)s;
    gateway_tb_printf(b, "%s{version=\"%s\"} 1\n", f->name, IDEM_BUILD_VERSION);
}

/* The process's figure f->arg (PROC_*), when it could be read (else the family has no
 * sample, as Prometheus clients do). */
enum { PROC_CPU, PROC_RSS, PROC_VSIZE, PROC_FDS, PROC_MAX_FDS, PROC_START };

static void writeProcess(struct textBuf *b, const struct family *f, const struct snap *s)
{
    const struct proc_self *p = &s->ps;
    switch (f->arg) {
    case PROC_CPU:
    case PROC_START:
        if (p->stat_ok) {
            gateway_tb_printf(b, "%s %.3f\n", f->name,
                              f->arg == PROC_CPU ? p->cpu_seconds : p->start_time_seconds);
        }
        return;
    case PROC_RSS:
    case PROC_VSIZE:
        if (p->stat_ok) {
            gateway_tb_printf(
                b, "%s %llu\n", f->name,
                (unsigned long long)(f->arg == PROC_RSS ? p->resident_bytes : p->virtual_bytes));
        }
        return;
    case PROC_FDS:
        if (p->fds_ok) {
            gateway_tb_printf(b, "%s %llu\n", f->name, (unsigned long long)p->open_fds);
        }
        return;
    default:
        if (p->max_fds_ok) {
            gateway_tb_printf(b, "%s %llu\n", f->name, (unsigned long long)p->max_fds);
        }
        return;
    }
}

/* ---- the families, in the order they are exposed -------------------------------------- */

#define ONE(field) .samples = {{NULL, U64(field)}}

static const struct family families[] = {
    {"idem_http_requests_total", "counter", "HTTP requests answered by the gateway.",
     .write = writeHttpRequests},
    {"idem_requests_total", "counter",
     "Answers to clients' data ops (claim, complete, release, renew, get) by service outcome, "
     "by the transport the client used: \"http\" the HTTP gateway and proxy listeners, \"rpc\" "
     "the binary RPC. A request a follower's gateway forwards to the leader is counted once, by "
     "that gateway, with the leader's answer (the leader counts it in "
     "idem_forwarded_requests_total). Admin ops are not counted.",
     .write = writeRequests},
    {"idem_fail_closed_total", "counter",
     "Unavailable answers (fail closed; the client retries with the same key), by transport: "
     "\"http\" every 503 of the gateway and proxy listeners, \"rpc\" every unavailable answer "
     "of the binary RPC to a client's data op or to a frame it refused unread "
     "(idem_rpc_frames_refused_total). A forwarded request is counted by the gateway that "
     "forwarded it.",
     .write = writeFailClosed},
    {"idem_claim_duration_seconds", "histogram",
     "Time from a claim being taken to its answer, by transport: \"http\" from the parsed JSON "
     "API request (a forward to the leader included), \"rpc\" from the decoded frame "
     "(forwarded claims not included).",
     .write = writeClaimDuration},
    {"idem_forwarded_requests_total", "counter",
     "Data ops other nodes' gateways forwarded to this node's binary RPC, by the outcome this "
     "node answered. Their clients are counted by the node they reached, not here: its JSON "
     "API's requests in idem_requests_total{transport=\"http\"}, its proxy listeners' claims "
     "only (the proxy's complete, release and renew are counted here alone).",
     .write = writeForwarded},
    {"idem_raft_append_duration_seconds", "histogram",
     "Time to write and sync a Raft log append on this node (raft's append to its "
     "completion).",
     .write = writeAppendDuration},
    {"idem_raft_append_oldest_seconds", "gauge",
     "Age of the oldest Raft log append still in flight on this node (0: none). An append that "
     "never ends (a disk that stopped answering) shows here, never in "
     "idem_raft_append_duration_seconds.",
     .write = writeAppendOldest},
    {"idem_build_info", "gauge", "1, labelled with the version of this idemd.",
     .write = writeBuildInfo},
    {"idem_is_leader", "gauge", "1 when this node is the Raft leader, else 0.", ONE(is_leader)},
    {"idem_has_leader", "gauge",
     "1 when this node knows a leader (itself or another node), else 0.", ONE(has_leader)},
    {"idem_raft_term", "gauge", "Current Raft term.", ONE(si.cluster.term)},
    {"idem_raft_commit_index", "gauge", "Raft commit index.", ONE(si.cluster.commit_index)},
    {"idem_raft_applied_index", "gauge", "Raft applied index.", ONE(si.cluster.applied_index)},
    {"idem_raft_log_entries", "gauge",
     "Log entries raft holds in memory: those since the last snapshot and the trailing ones it "
     "kept (raft.snapshot_trailing, within raft.snapshot_trailing_max_mb).",
     ONE(si.cluster.log_entries)},
    {"idem_raft_leader_changes_total", "counter", "Leader changes seen by this node.",
     ONE(si.cluster.leader_changes)},
    {"idem_raft_snapshot_threshold", "gauge",
     "Entries between snapshots now (adapted to the last snapshot's size).",
     ONE(si.cluster.snapshot_threshold)},
    {"idem_raft_snapshot_bytes", "gauge",
     "Size of the last snapshot taken or restored (its serialised data).",
     ONE(si.cluster.snapshot_bytes_last)},
    {"idem_raft_snapshot_index", "gauge",
     "Index of the last snapshot stored on this node (or loaded at start).",
     ONE(si.cluster.last_snapshot_index)},
    {"idem_raft_snapshot_store_failures_total", "counter",
     "Snapshots of this node's own that could not be stored (the log keeps its entries; the "
     "next attempt comes a snapshot threshold later).",
     ONE(si.cluster.snapshot_store_failures)},
    {"idem_records", "gauge", "Records held (released markers excluded).", ONE(records)},
    {"idem_tombstones", "gauge", "Tombstones held.", ONE(si.fsm.tombstones)},
    {"idem_quarantined", "gauge", "Quarantined records.", ONE(si.fsm.quarantined)},
    {"idem_bytes", "gauge", "Bytes counted against quotas.", ONE(si.fsm.bytes)},
    {"idem_rpc_connections", "gauge", "Open connections of the binary RPC listener.",
     ONE(rs.connections)},
    {"idem_http_connections", "gauge",
     "Open connections of the HTTP gateway and proxy listeners (at most "
     "http.max_connections).",
     ONE(connections)},
    {"idem_http_connections_refused_total", "counter",
     "HTTP connections closed at their accept: http.max_connections were open "
     "(limit=\"connections\"), or their address held http.max_connections_per_address "
     "(limit=\"address\").",
     .label = "limit",
     .samples = {{"address", U64(refused_address)}, {"connections", U64(connections_refused)}}},
    {"idem_http_forwards_moved_total", "counter",
     "Requests this node forwarded to a node that stopped leading before it answered, sent "
     "again to the new leader.",
     ONE(forwards_moved)},
    {"idem_rpc_inflight_requests", "gauge",
     "RPC requests taken that await their answer (at most 4096 per connection).", ONE(rs.inflight)},
    {"idem_rpc_frame_buffer_bytes", "gauge",
     "Memory held by the RPC connections' frame buffers (64 KiB each when idle; their growth "
     "past that at most rpc.max_frame_buffer_mb together).",
     ONE(rs.frame_buffer_bytes)},
    {"idem_rpc_frames_refused_total", "counter",
     "RPC frames answered unavailable and skipped: the frame buffers' growth had reached "
     "rpc.max_frame_buffer_mb.",
     ONE(rs.frames_refused)},
    {"idem_proposals_pending_bytes", "gauge",
     "Commands this leader proposed that are not yet applied, each counted as its bytes + 256 "
     "(clients' commands are refused past batch.max_pending_mb; the leader's own expire "
     "entries are not).",
     ONE(si.cluster.pending_bytes)},
    {"idem_proposals_queued_bytes", "gauge",
     "Commands this leader holds back, counted as idem_proposals_pending_bytes (and in it): "
     "their tenant had batch.tenant_max_inflight_kb in the log's queue; they go in as its "
     "earlier ones commit.",
     ONE(si.cluster.queued_bytes)},
    {"idem_proposals_refused_total", "counter",
     "Commands answered unavailable because batch.max_pending_mb were pending.",
     ONE(si.cluster.pending_refused)},
    {"idem_proposals_transfer_refused_total", "counter",
     "Commands answered unavailable because this leader was handing its leadership to another "
     "voter (raft takes no entry meanwhile).",
     ONE(si.cluster.transfer_refused)},
    {"idem_batch_waits_total", "counter",
     "Batches this leader held for batch.delay_us to go in with the commands after them "
     "(group commit).",
     ONE(si.cluster.batch_waits)},
    {"idem_batch_waits_off_total", "counter",
     "Times this leader stopped holding batches for 100 ms: three waits in a row that no "
     "command joined (callers that wait for their answers before sending more).",
     ONE(si.cluster.batch_waits_off)},
    {"idem_raft_applied_after_answer_total", "counter",
     "Log entries this node applied as a follower just after answering the append that "
     "committed them, so that applying them did not hold up the answer.",
     ONE(si.cluster.applied_after_answer)},
    {"idem_proposals_not_proposed_total", "counter",
     "Commands this leader took that never went into the log: their batch refused by raft (a "
     "leadership transfer began, or the node stopped leading, first), or held back "
     "(batch.tenant_max_inflight_kb) when it stopped leading. Answered unavailable.",
     ONE(si.cluster.not_proposed)},
    {"idem_proposals_share_refused_total", "counter",
     "Commands answered unavailable because their tenant had its share of batch.max_pending_mb "
     "pending (batch.tenant_max_pending_percent), every tenant's.",
     ONE(si.cluster.share_refused)},
    {"idem_rpc_answer_buffer_bytes", "gauge",
     "Answers of the binary RPC waiting to be written, every connection's together (at most "
     "rpc.max_answer_buffer_mb, and 64 MiB per connection).",
     ONE(rs.answer_buffer_bytes)},
    {"idem_tenant_proposals_pending_bytes", "gauge",
     "A tenant's commands this leader proposed that are not yet applied, counted as "
     "idem_proposals_pending_bytes (at most batch.tenant_max_pending_percent of "
     "batch.max_pending_mb, or one command).",
     .write = writeTenant, .arg = 0},
    {"idem_tenant_proposals_queued_bytes", "gauge",
     "A tenant's commands this leader holds back until its earlier ones commit "
     "(batch.tenant_max_inflight_kb), of idem_tenant_proposals_pending_bytes.",
     .write = writeTenant, .arg = 1},
    {"idem_tenant_proposals_refused_total", "counter",
     "A tenant's commands answered unavailable because it had its share of "
     "batch.max_pending_mb pending.",
     .write = writeTenant, .arg = 2},
    {"idem_tenant_records", "gauge",
     "A tenant's records held against its quota (released markers excluded).",
     .write = writeTenantUsage, .arg = 0},
    {"idem_tenant_bytes", "gauge",
     "A tenant's bytes held against its quota (key + fingerprint + stored response of each "
     "record).",
     .write = writeTenantUsage, .arg = 1},
    {"idem_tenant_quota_records", "gauge",
     "A tenant's quota of records as this node's configuration sets it (0: unlimited).",
     .write = writeTenantUsage, .arg = 2},
    {"idem_tenant_quota_bytes", "gauge",
     "A tenant's quota of bytes as this node's configuration sets it (0: unlimited).",
     .write = writeTenantUsage, .arg = 3},
    {"idem_raft_corrections_total", "counter",
     "Corrections of libraft 0.15 made by this node's raft I/O wrapper (cluster/io.h): answers "
     "and commit indexes clamped, results held by a leader, AppendEntries cut at the snapshot, "
     "a follower's match index lowered to the snapshot it installed after losing its data, an "
     "answer without a leader address not sent, the leader's snapshot held while this "
     "follower stored another, a leadership transfer's TimeoutNow held while this follower "
     "wrote a configuration entry, and of those the ones dropped for their age.",
     .label = "kind",
     .samples = {{"clamp", U64(si.cluster.raft_clamped)},
                 {"hold", U64(si.cluster.raft_held)},
                 {"cut", U64(si.cluster.raft_cut)},
                 {"rematch", U64(si.cluster.raft_rematched)},
                 {"unaddressed", U64(si.cluster.raft_unaddressed)},
                 {"install_held", U64(si.cluster.raft_installs_held)},
                 {"timeout_now_held", U64(si.cluster.raft_timeouts_held)},
                 {"timeout_now_dropped", U64(si.cluster.raft_timeouts_dropped)}}},
    {"idem_rpc_connections_cut_total", "counter",
     "RPC connections closed for the answers waiting to be written to them: past 64 MiB of its "
     "own (limit=\"connection\"), or as the one holding the most when every connection's "
     "together passed rpc.max_answer_buffer_mb (limit=\"node\").",
     .label = "limit",
     .samples = {{"connection", U64(rs.answer_cuts_connection)},
                 {"node", U64(rs.answer_cuts_node)}}},
    {"idem_rpc_frames_rejected_total", "counter",
     "RPC frames refused before protobuf-c decoded them: answered unauthenticated (no known "
     "token; past rpc.unauthenticated_max_frame_bytes, none in their first bytes), or invalid "
     "for too many fields, a field number idem.proto does not have, bytes that are not a "
     "Request, or a decode past its memory budget.",
     .label = "reason",
     .samples = {{"unauthenticated", U64(rs.rejected_unauthenticated)},
                 {"fields", U64(rs.rejected_fields)},
                 {"unknown_field", U64(rs.rejected_unknown_field)},
                 {"malformed", U64(rs.rejected_malformed)},
                 {"decode_memory", U64(rs.rejected_decode_memory)}}},
    {"idem_rpc_connections_refused_total", "counter",
     "RPC connections closed at their accept: their address held "
     "rpc.max_connections_per_address (limit=\"address\"), or every slot they may take was "
     "held by members and authenticated clients (limit=\"connections\").",
     .label = "limit",
     .samples = {{"address", U64(rs.refused_address)},
                 {"connections", U64(rs.refused_connections)}}},
    {"idem_rpc_connections_dropped_total", "counter",
     "RPC connections closed that had not authenticated: the oldest one, to admit a new "
     "connection when the slots were full (reason=\"evicted\"), or one with no frame and no "
     "known token rpc.first_frame_timeout_ms after its accept "
     "(reason=\"first_frame_timeout\").",
     .label = "reason",
     .samples = {{"evicted", U64(rs.dropped_evicted)},
                 {"first_frame_timeout", U64(rs.dropped_first_frame)}}},
    {"idem_table_index_bytes", "gauge",
     "Memory of the record table's slot arrays (the records themselves are not counted): the "
     "array in use, the part of the one being migrated from during a growth, the part of the "
     "next growth's array faulted in ahead of it, and the slot copy kept for the next "
     "snapshot.",
     .label = "array",
     .samples = {{"slots", U64(si.fsm.index_slots_bytes)},
                 {"migrating", U64(si.fsm.index_migrating_bytes)},
                 {"ahead", U64(si.fsm.index_ahead_bytes)},
                 {"snapshot_spare", U64(si.fsm.snapshot_spare_bytes)}}},
    {"idem_as_tenant_refused_total", "counter",
     "RPC requests asking to act for a tenant (as_tenant, a follower's proxy) that this node "
     "refused: the token was not the cluster secret (reason=\"secret\"), no proxy route of "
     "this node names the tenant (reason=\"tenant\"), the op is not a data op "
     "(reason=\"op\").",
     .label = "reason",
     .samples = {{"secret", U64(ss.as_tenant_refused_secret)},
                 {"tenant", U64(ss.as_tenant_refused_tenant)},
                 {"op", U64(ss.as_tenant_refused_op)}}},
    {"idem_raft_aio_contexts_destroyed_total", "counter",
     "Kernel AIO contexts of raft's log writer destroyed, by the thread that waited for "
     "io_destroy: the reaper thread (cluster/aio_reap.h), or the caller's (the loop) when the "
     "reaper could not take one.",
     .label = "thread",
     .samples = {{"reaper", U64(io.aio_destroyed_reaper)},
                 {"caller", U64(io.aio_destroyed_caller)}}},
    {"idem_raft_aio_destroy_failures_total", "counter",
     "io_destroy calls of the reaper thread that failed.", ONE(io.aio_destroy_failed)},
    {"idem_raft_segments_prefilled_total", "counter",
     "raft's open log segments by what happened before their first append "
     "(cluster/segfill.h): written through with zeros, left as allocated (not ext4 or XFS, or "
     "raft.prefill_segments off), or a zero write failed (the segment is used as allocated).",
     .label = "result",
     .samples = {{"filled", U64(io.segments_filled)},
                 {"skipped", U64(io.segments_skipped)},
                 {"failed", U64(io.segments_failed)}}},
    {"idem_raft_messages_refused_total", "counter",
     "Raft messages from peers refused before libraft decoded them (malformed: "
     "cluster/wire_check.h); each closed its connection.",
     ONE(io.messages_refused)},
    {"idem_raft_connections_refused_total", "counter",
     "Raft connections from peers closed before raft had them: a handshake that broke its "
     "rules, or an authentication that failed (raft.secret_file; cluster/transport.h).",
     ONE(io.connections_refused)},
    {"idem_raft_connect_auth_failures_total", "counter",
     "Raft connections to peers closed before raft had them: the peer's authentication was "
     "wrong, or it closed the connection or did not answer within 10 s (another secret, none, "
     "or it stopped).",
     ONE(io.connect_auth_failed)},
    {"process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.",
     .write = writeProcess, .arg = PROC_CPU},
    {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
     .write = writeProcess, .arg = PROC_RSS},
    {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
     .write = writeProcess, .arg = PROC_VSIZE},
    {"process_open_fds", "gauge", "Number of open file descriptors.", .write = writeProcess,
     .arg = PROC_FDS},
    {"process_max_fds", "gauge", "Maximum number of open file descriptors (the soft limit).",
     .write = writeProcess, .arg = PROC_MAX_FDS},
    {"process_start_time_seconds", "gauge",
     "Start time of the process since the Unix epoch in seconds.", .write = writeProcess,
     .arg = PROC_START},
    {"idem_config_reloads_total", "counter",
     "Configuration reloads (SIGHUP, idemctl reload) since the start: applied "
     "(result=\"ok\"), or refused with the running configuration kept (result=\"error\": "
     "the log says why).",
     .label = "result", .samples = {{"ok", U64(reload.ok)}, {"error", U64(reload.error)}}},
    {"idem_config_last_reload_success_timestamp_seconds", "gauge",
     "Unix time of the last successful configuration load: the start, or the last reload "
     "that succeeded.",
     ONE(reload.last_success_s)},
};

/* Writes one family: HELP, TYPE, samples. */
static void writeFamily(struct textBuf *b, const struct family *f, const struct snap *s)
{
    gateway_tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type);
    if (f->write != NULL) {
        f->write(b, f, s);
        return;
    }
    if (f->label == NULL) {
        gateway_tb_printf(b, "%s %llu\n", f->name,
                          (unsigned long long)snapU64(s, f->samples[0].off));
        return;
    }
    for (size_t i = 0; i < FAMILY_SAMPLES_MAX && f->samples[i].value != NULL; i++) {
        gateway_tb_printf(b, "%s{%s=\"%s\"} %llu\n", f->name, f->label, f->samples[i].value,
                          (unsigned long long)snapU64(s, f->samples[i].off));
    }
}

void metrics_answer(struct http_server *h, h2o_req_t *req, h2o_iovec_t rid)
{
    struct snap s = {.h = h};
    service_get_info(h->svc, &s.si);
    rpc_get_stats(&s.rs);
    cluster_get_io_counters(&s.io);
    service_get_stats(h->svc, &s.ss);
    reload_get_stats(&s.reload);
    s.records = s.si.fsm.records - s.si.fsm.released;
    s.connections = h->m.connections;
    s.connections_refused = h->m.connections_refused;
    s.refused_address = h->m.refused_address;
    s.forwards_moved = h->m.forwards_moved;
    s.is_leader = s.si.cluster.state == RAFT_LEADER;
    s.has_leader = s.si.cluster.leader_id != 0;
    proc_self_read(&s.ps);
    struct textBuf b;
    gateway_tb_init(&b, 8192);
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        writeFamily(&b, &families[i], &s);
    }
    gateway_send_raw(h, req, R_METRICS, rid, 200, "text/plain; version=0.0.4", b.p, b.len, NULL, 0);
    free(b.p);
}
