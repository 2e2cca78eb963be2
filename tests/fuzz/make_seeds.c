/* make_seeds: writes the binary seed corpora of the fuzz targets whose inputs are protobuf
 * bytes (fuzz_fsm_apply, fuzz_snapshot_restore, fuzz_rpc_request, fuzz_rpc_scan: the same
 * requests, fuzz_client_response) or the Raft port's bytes (fuzz_raft_message,
 * fuzz_raft_handshake). The text seeds (fuzz_config, fuzz_fingerprint, fuzz_http_api_body)
 * are written by hand.
 *
 *   fuzz_make_seeds tests/fuzz/corpus
 *
 * writes CORPUS/<target>/<name> for each seed; the directories must exist. Regenerate after
 * a change to idem.proto or to the command semantics. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm.h"
#include "frame.h"
#include "idem.pb-c.h"
#include "transport.h"

static const char *corpus;

static void writeFile(const char *target, const char *name, const uint8_t *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", corpus, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* ---- command sequences (fuzz_fsm_apply input format) ----------------------------------- */

struct seq {
    uint8_t buf[4096];
    size_t len;
    struct fsm *f; /* the same commands applied, for the snapshot seeds */
    uint64_t index;
};

static void seqInit(struct seq *s)
{
    s->len = 0;
    s->f = fsm_new();
    s->index = 1;
}

static void seqAdd(struct seq *s, const Idem__Command *cmd)
{
    size_t n = idem__command__get_packed_size(cmd);
    if (s->len + 2 + n > sizeof s->buf) {
        abort();
    }
    s->buf[s->len++] = (uint8_t)n;
    s->buf[s->len++] = (uint8_t)(n >> 8);
    idem__command__pack(cmd, s->buf + s->len);
    struct fsm_result r;
    fsm_apply(s->f, s->index++, s->buf + s->len, n, &r);
    s->len += n;
}

static uint8_t fpBytes[32];

static ProtobufCBinaryData bin(const char *str)
{
    ProtobufCBinaryData b = {str ? strlen(str) : 0, (uint8_t *)str};
    return b;
}

static void claim(struct seq *s, uint64_t now, const char *tenant, const char *key,
                  const char *attempt, Idem__LeasePolicy policy, uint64_t max_records)
{
    Idem__ClaimCmd c = IDEM__CLAIM_CMD__INIT;
    Idem__TenantLimits lim = IDEM__TENANT_LIMITS__INIT;
    c.tenant = (char *)tenant;
    c.key = bin(key);
    c.fingerprint.data = fpBytes;
    c.fingerprint.len = sizeof fpBytes;
    c.attempt_id = bin(attempt);
    c.lease_ms = 1000;
    c.ttl_ms = 10000;
    c.policy = policy;
    if (max_records) {
        lim.max_records = max_records;
        c.limits = &lim;
    }
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_CLAIM;
    cmd.claim = &c;
    seqAdd(s, &cmd);
}

static void complete(struct seq *s, uint64_t now, const char *key, uint64_t token,
                     Idem__Completion outcome)
{
    Idem__CompleteCmd c = IDEM__COMPLETE_CMD__INIT;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    Idem__Header hdr = IDEM__HEADER__INIT;
    Idem__Header *hdrs[1] = {&hdr};
    hdr.name = "content-type";
    hdr.value = bin("application/json");
    resp.status = 201;
    resp.n_headers = 1;
    resp.headers = hdrs;
    resp.body = bin("{\"id\":1}");
    c.tenant = "t1";
    c.key = bin(key);
    c.token = token;
    c.outcome = outcome;
    c.response = &resp;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_COMPLETE;
    cmd.complete = &c;
    seqAdd(s, &cmd);
}

static void release(struct seq *s, uint64_t now, const char *key, uint64_t token)
{
    Idem__ReleaseCmd c = IDEM__RELEASE_CMD__INIT;
    c.tenant = "t1";
    c.key = bin(key);
    c.token = token;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_RELEASE;
    cmd.release = &c;
    seqAdd(s, &cmd);
}

static void renew(struct seq *s, uint64_t now, const char *key, uint64_t token)
{
    Idem__RenewCmd c = IDEM__RENEW_CMD__INIT;
    c.tenant = "t1";
    c.key = bin(key);
    c.token = token;
    c.lease_ms = 5000;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_RENEW;
    cmd.renew = &c;
    seqAdd(s, &cmd);
}

static void get(struct seq *s, uint64_t now, const char *key)
{
    Idem__GetCmd c = IDEM__GET_CMD__INIT;
    c.tenant = "t1";
    c.key = bin(key);
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_GET;
    cmd.get = &c;
    seqAdd(s, &cmd);
}

static void resolve(struct seq *s, uint64_t now, const char *key, int rel)
{
    Idem__ResolveCmd c = IDEM__RESOLVE_CMD__INIT;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    c.tenant = "t1";
    c.key = bin(key);
    c.release = rel;
    if (!rel) {
        resp.status = 200;
        resp.body = bin("resolved");
        c.response = &resp;
    }
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_RESOLVE;
    cmd.resolve = &c;
    seqAdd(s, &cmd);
}

static void expire(struct seq *s, uint64_t now, uint32_t batch)
{
    Idem__ExpireCmd c = IDEM__EXPIRE_CMD__INIT;
    c.max_batch = batch;
    Idem__Command cmd = IDEM__COMMAND__INIT;
    cmd.now_ms = now;
    cmd.op_case = IDEM__COMMAND__OP_EXPIRE;
    cmd.expire = &c;
    seqAdd(s, &cmd);
}

/* Writes the sequence, its final snapshot, and the snapshot without its trailer (which
 * fuzz_snapshot_restore's variant 2 completes). */
static void seqDone(struct seq *s, const char *name)
{
    writeFile("fuzz_fsm_apply", name, s->buf, s->len);
    uint8_t *snap;
    size_t n;
    fsm_snapshot(s->f, &snap, &n);
    char nm[256];
    snprintf(nm, sizeof nm, "%s.snap", name);
    writeFile("fuzz_snapshot_restore", nm, snap, n);
    snprintf(nm, sizeof nm, "%s.notrailer", name);
    writeFile("fuzz_snapshot_restore", nm, snap, n - 8);
    free(snap);
    fsm_close(s->f);
}

static void commandSeeds(void)
{
    struct seq s;
    const Idem__LeasePolicy conflict = IDEM__LEASE_POLICY__LEASE_POLICY_UNSPECIFIED;

    /* Tokens are command indexes: the k-th command (from 1) of a sequence is index k. */
    seqInit(&s);
    claim(&s, 1000, "t1", "k1", NULL, conflict, 0);
    complete(&s, 1100, "k1", 1, IDEM__COMPLETION__COMPLETION_SUCCEEDED);
    claim(&s, 1200, "t1", "k1", NULL, conflict, 0); /* replay */
    get(&s, 1300, "k1");
    seqDone(&s, "claim-complete-replay");

    seqInit(&s);
    claim(&s, 1000, "t1", "k1", "attempt-1", conflict, 0);
    renew(&s, 1500, "k1", 1);
    claim(&s, 1600, "t1", "k1", "attempt-1", conflict, 0); /* same attempt */
    release(&s, 1700, "k1", 1);
    release(&s, 1800, "k1", 1); /* repeated: ok */
    claim(&s, 1900, "t1", "k1", NULL, conflict, 0);
    seqDone(&s, "attempt-renew-release");

    seqInit(&s);
    claim(&s, 1000, "t1", "k1", NULL, conflict, 0);
    complete(&s, 1100, "k1", 1, IDEM__COMPLETION__COMPLETION_UNKNOWN);
    claim(&s, 1200, "t1", "k1", NULL, conflict, 0); /* outcome unknown */
    resolve(&s, 1300, "k1", 0);
    claim(&s, 1400, "t1", "k2", NULL, conflict, 0);
    complete(&s, 1500, "k2", 5, IDEM__COMPLETION__COMPLETION_UNKNOWN);
    resolve(&s, 1600, "k2", 1);
    seqDone(&s, "quarantine-resolve");

    seqInit(&s);
    claim(&s, 1000, "t1", "k1", NULL, IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER, 0);
    claim(&s, 3000, "t1", "k1", NULL, IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER, 0);
    complete(&s, 3100, "k1", 1, IDEM__COMPLETION__COMPLETION_SUCCEEDED); /* lease lost */
    complete(&s, 3200, "k1", 2, IDEM__COMPLETION__COMPLETION_FAILED_FINAL);
    claim(&s, 3300, "t1", "k2", NULL, conflict, 0);
    expire(&s, 20000, 16);
    claim(&s, 20100, "t1", "k2", NULL, conflict, 0); /* expired */
    expire(&s, 40000, 16);
    seqDone(&s, "takeover-expire");

    seqInit(&s);
    claim(&s, 1000, "t1", "k1", NULL, conflict, 2);
    claim(&s, 1001, "t1", "k2", NULL, conflict, 2);
    claim(&s, 1002, "t1", "k3", NULL, conflict, 2); /* quota */
    claim(&s, 1003, "t2", "k1", NULL, conflict, 0);
    claim(&s, 5000, "t1", "k1", NULL, conflict, 0); /* lease expired, conflict */
    seqDone(&s, "quota-tenants");

    /* One empty snapshot. */
    seqInit(&s);
    seqDone(&s, "empty");
}

/* ---- RPC requests ---------------------------------------------------------------------- */

static void writeRequest(const char *name, Idem__Request *req)
{
    uint8_t buf[1024];
    req->request_id = 42;
    req->deadline_ms = 2000;
    req->auth_token = bin("example-demo-token");
    size_t n = idem__request__get_packed_size(req);
    if (n > sizeof buf) {
        abort();
    }
    idem__request__pack(req, buf);
    writeFile("fuzz_rpc_request", name, buf, n);
    writeFile("fuzz_rpc_scan", name, buf, n);
}

static void requestSeeds(void)
{
    Idem__Request req = IDEM__REQUEST__INIT;
    Idem__ClaimRequest claim_r = IDEM__CLAIM_REQUEST__INIT;
    claim_r.key = bin("order-1");
    claim_r.fingerprint.data = fpBytes;
    claim_r.fingerprint.len = sizeof fpBytes;
    claim_r.attempt_id = bin("a1");
    claim_r.lease_ms = 1000;
    claim_r.policy = IDEM__LEASE_POLICY__LEASE_POLICY_TAKEOVER;
    req.op_case = IDEM__REQUEST__OP_CLAIM;
    req.claim = &claim_r;
    writeRequest("claim", &req);

    Idem__CompleteRequest comp = IDEM__COMPLETE_REQUEST__INIT;
    Idem__StoredResponse resp = IDEM__STORED_RESPONSE__INIT;
    Idem__Header hdr = IDEM__HEADER__INIT;
    Idem__Header *hdrs[1] = {&hdr};
    hdr.name = "content-type";
    hdr.value = bin("text/plain");
    resp.status = 200;
    resp.n_headers = 1;
    resp.headers = hdrs;
    resp.body_ref = "s3://bucket/object";
    resp.body_sha256.data = fpBytes;
    resp.body_sha256.len = sizeof fpBytes;
    comp.key = bin("order-1");
    comp.token = 65536;
    comp.outcome = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    comp.response = &resp;
    req.op_case = IDEM__REQUEST__OP_COMPLETE;
    req.complete = &comp;
    writeRequest("complete", &req);

    Idem__ReleaseRequest rel = IDEM__RELEASE_REQUEST__INIT;
    rel.key = bin("order-1");
    rel.token = 65536;
    req.op_case = IDEM__REQUEST__OP_RELEASE;
    req.release = &rel;
    writeRequest("release", &req);

    Idem__RenewRequest ren = IDEM__RENEW_REQUEST__INIT;
    ren.key = bin("order-1");
    ren.token = 65536;
    ren.lease_ms = 3000;
    req.op_case = IDEM__REQUEST__OP_RENEW;
    req.renew = &ren;
    writeRequest("renew", &req);

    Idem__GetRequest g = IDEM__GET_REQUEST__INIT;
    g.key = bin("order-1");
    req.op_case = IDEM__REQUEST__OP_GET;
    req.get = &g;
    writeRequest("get", &req);

    Idem__StatusRequest st = IDEM__STATUS_REQUEST__INIT;
    st.digest = 1;
    req.op_case = IDEM__REQUEST__OP_STATUS;
    req.status = &st;
    writeRequest("status", &req);

    Idem__MembersRequest mem = IDEM__MEMBERS_REQUEST__INIT;
    mem.action = IDEM__MEMBERS_REQUEST__ACTION__ACTION_ADD;
    mem.id = 4;
    mem.raft_address = "127.0.0.1:9004";
    mem.rpc_address = "127.0.0.1:7004";
    mem.http_address = "127.0.0.1:8004";
    req.op_case = IDEM__REQUEST__OP_MEMBERS;
    req.members = &mem;
    writeRequest("members", &req);

    Idem__TransferRequest tr = IDEM__TRANSFER_REQUEST__INIT;
    tr.id = 2;
    req.op_case = IDEM__REQUEST__OP_TRANSFER;
    req.transfer = &tr;
    writeRequest("transfer", &req);

    Idem__SnapshotRequest sn = IDEM__SNAPSHOT_REQUEST__INIT;
    req.op_case = IDEM__REQUEST__OP_SNAPSHOT;
    req.snapshot = &sn;
    writeRequest("snapshot", &req);

    Idem__ResolveRequest res = IDEM__RESOLVE_REQUEST__INIT;
    Idem__StoredResponse rresp = IDEM__STORED_RESPONSE__INIT;
    rresp.status = 409;
    rresp.body = bin("{\"error\":\"conflict\"}");
    res.tenant = "demo";
    res.key = bin("order-1");
    res.response = &rresp;
    req.op_case = IDEM__REQUEST__OP_RESOLVE;
    req.resolve = &res;
    writeRequest("resolve", &req);
}

/* ---- libidem's answers (fuzz_client_response: the id awaited, then frames) ------------- */

struct stream {
    uint8_t buf[4096];
    size_t len;
};

static void streamFrame(struct stream *st, const Idem__Response *m)
{
    size_t n = idem__response__get_packed_size(m);
    if (st->len + FRAME_HEADER_LEN + n > sizeof st->buf) {
        abort();
    }
    frame_header_put(st->buf + st->len, (uint32_t)n);
    idem__response__pack(m, st->buf + st->len + FRAME_HEADER_LEN);
    st->len += FRAME_HEADER_LEN + n;
}

/* A stream awaiting request `expect` of the answer m alone. */
static void writeAnswer(const char *name, uint8_t expect, const Idem__Response *m)
{
    struct stream st = {.buf = {expect}, .len = 1};
    streamFrame(&st, m);
    writeFile("fuzz_client_response", name, st.buf, st.len);
}

static Idem__Response answerTo(uint64_t id, Idem__Result *res)
{
    Idem__Response m = IDEM__RESPONSE__INIT;
    m.request_id = id;
    m.result = res;
    return m;
}

static void responseSeeds(void)
{
    Idem__Result acq = IDEM__RESULT__INIT;
    acq.outcome = IDEM__OUTCOME__OUTCOME_ACQUIRED;
    acq.token = 4456448;
    acq.lease_deadline_ms = 1700000030000;
    acq.expires_at_ms = 1700086400000;
    acq.lease_ms = 30000;
    acq.takeover = 1;
    acq.previous_token = 65536;
    Idem__Response m = answerTo(7, &acq);
    writeAnswer("acquired", 7, &m);

    Idem__StoredResponse sr = IDEM__STORED_RESPONSE__INIT;
    Idem__Header h1 = IDEM__HEADER__INIT, h2 = IDEM__HEADER__INIT;
    Idem__Header *hdrs[2] = {&h1, &h2};
    h1.name = "content-type";
    h1.value = bin("application/json");
    h2.name = "location";
    h2.value = bin("/orders/7");
    sr.status = 201;
    sr.n_headers = 2;
    sr.headers = hdrs;
    sr.body = bin("{\"id\":7}");
    sr.body_sha256.data = fpBytes;
    sr.body_sha256.len = sizeof fpBytes;
    Idem__Result rep = IDEM__RESULT__INIT;
    rep.outcome = IDEM__OUTCOME__OUTCOME_REPLAY;
    rep.response = &sr;
    m = answerTo(7, &rep);
    writeAnswer("replay", 7, &m);

    /* A get: the record's stored response is packed inside it. */
    Idem__StoredResponse ref = IDEM__STORED_RESPONSE__INIT;
    ref.status = 200;
    ref.n_headers = 1;
    ref.headers = hdrs;
    ref.body_ref = "s3://bucket/object";
    ref.body_sha256.data = fpBytes;
    ref.body_sha256.len = sizeof fpBytes;
    uint8_t packed[256];
    size_t pn = idem__stored_response__pack(&ref, packed);
    Idem__Record rec = IDEM__RECORD__INIT;
    rec.key = bin("order-1");
    rec.fingerprint.data = fpBytes;
    rec.fingerprint.len = sizeof fpBytes;
    rec.state = IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
    rec.token = 4456448;
    rec.completion = IDEM__COMPLETION__COMPLETION_SUCCEEDED;
    rec.response.data = packed;
    rec.response.len = pn;
    Idem__Result get = IDEM__RESULT__INIT;
    get.outcome = IDEM__OUTCOME__OUTCOME_OK;
    get.record = &rec;
    m = answerTo(7, &get);
    writeAnswer("get-record", 7, &m);

    Idem__Result nl = IDEM__RESULT__INIT;
    nl.outcome = IDEM__OUTCOME__OUTCOME_NOT_LEADER;
    m = answerTo(7, &nl);
    m.leader_rpc_address = "127.0.0.1:7002";
    m.error = "not the leader";
    writeAnswer("not-leader", 7, &m);

    Idem__Result busy = IDEM__RESULT__INIT;
    busy.outcome = IDEM__OUTCOME__OUTCOME_UNAVAILABLE;
    busy.retry_after_ms = 50;
    busy.detail = "the pending budget is full";
    m = answerTo(7, &busy);
    writeAnswer("unavailable-busy", 7, &m);

    Idem__Result big = IDEM__RESULT__INIT;
    big.outcome = IDEM__OUTCOME__OUTCOME_INVALID;
    big.detail = "frame_too_large";
    m = answerTo(7, &big);
    writeAnswer("frame-too-large", 7, &m);

    m = answerTo(0, NULL);
    m.error = "the request frame does not decode";
    writeAnswer("refused-frame", 7, &m);

    m = answerTo(7, NULL);
    writeAnswer("no-result", 7, &m);

    /* An answer to a request given up on, then ours; and the same read by the asynchronous
     * client (no id awaited), then a prefix over the limit. */
    struct stream st = {.buf = {7}, .len = 1};
    m = answerTo(6, &busy);
    streamFrame(&st, &m);
    m = answerTo(7, &rep);
    streamFrame(&st, &m);
    writeFile("fuzz_client_response", "skipped-then-mine", st.buf, st.len);
    st.buf[0] = 0;
    memcpy(st.buf + st.len, "HTTP/1.1 400 Bad Request\r\n", 26);
    st.len += 26;
    writeFile("fuzz_client_response", "async-then-http", st.buf, st.len);
}

/* ---- Raft messages (fuzz_raft_message: the type, then the header) ----------------------- */

static size_t le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
    return (size_t)bytes;
}

static void writeMessage(const char *name, uint8_t type, const uint64_t *words, size_t n_words,
                         const uint8_t *tail, size_t tail_len)
{
    uint8_t buf[512] = {type};
    size_t n = 1;
    for (size_t i = 0; i < n_words; i++) {
        n += le(buf + n, words[i], 8);
    }
    if (tail_len > 0) {
        memcpy(buf + n, tail, tail_len);
    }
    writeFile("fuzz_raft_message", name, buf, n + tail_len);
}

/* One AppendEntries entry header: term, type, 3 unused bytes, u32 data length. */
static size_t entry(uint8_t *p, uint64_t term, uint8_t type, uint32_t len)
{
    memset(p, 0, 16);
    le(p, term, 8);
    p[8] = type;
    le(p + 12, len, 4);
    return 16;
}

/* raft's configuration encoding: format 1, u64 count, then per server its ID, address with
 * its NUL and role; padded to 8 bytes. */
static size_t configuration(uint8_t *p, unsigned n)
{
    size_t at = 0;
    p[at++] = 1;
    at += le(p + at, n, 8);
    for (unsigned i = 1; i <= n; i++) {
        at += le(p + at, i, 8);
        at += (size_t)sprintf((char *)p + at, "127.0.0.1:900%u", i) + 1;
        p[at++] = 1; /* RAFT_VOTER */
    }
    while (at % 8 != 0) {
        p[at++] = 0;
    }
    return at;
}

static void messageSeeds(void)
{
    const uint64_t vote[] = {5, 1, 120, 4, 1};
    writeMessage("request-vote", RAFT_IO_REQUEST_VOTE, vote, 5, NULL, 0);
    writeMessage("request-vote-v1", RAFT_IO_REQUEST_VOTE, vote, 4, NULL, 0);
    const uint64_t result[] = {5, 1, 1};
    writeMessage("request-vote-result", RAFT_IO_REQUEST_VOTE_RESULT, result, 3, NULL, 0);
    const uint64_t aer[] = {5, 0, 120};
    writeMessage("append-entries-result", RAFT_IO_APPEND_ENTRIES_RESULT, aer, 3, NULL, 0);
    writeMessage("timeout-now", RAFT_IO_TIMEOUT_NOW, aer, 3, NULL, 0);
    const uint64_t heartbeat[] = {5, 120, 4, 118, 0};
    writeMessage("heartbeat", RAFT_IO_APPEND_ENTRIES, heartbeat, 5, NULL, 0);
    const uint64_t three[] = {5, 120, 4, 118, 3};
    uint8_t ents[64];
    size_t en = entry(ents, 5, RAFT_COMMAND, 16);
    en += entry(ents + en, 5, RAFT_BARRIER, 8);
    en += entry(ents + en, 5, RAFT_CHANGE, 48);
    writeMessage("append-entries", RAFT_IO_APPEND_ENTRIES, three, 5, ents, en);
    /* The message that crashed a node before wire_check (wire_check.h): one entry of type 9. */
    const uint64_t one[] = {5, 120, 4, 118, 1};
    entry(ents, 5, 9, 8);
    writeMessage("append-entries-bad-type", RAFT_IO_APPEND_ENTRIES, one, 5, ents, 16);
    entry(ents, 5, RAFT_COMMAND, 12);
    writeMessage("append-entries-unaligned", RAFT_IO_APPEND_ENTRIES, one, 5, ents, 16);
    uint8_t conf[256];
    size_t cn = configuration(conf, 3);
    const uint64_t snap[] = {5, 118, 4, 100, cn};
    uint8_t tail[264];
    memcpy(tail, conf, cn);
    le(tail + cn, 4096, 8);
    writeMessage("install-snapshot", RAFT_IO_INSTALL_SNAPSHOT, snap, 5, tail, cn + 8);
    writeMessage("unknown-type", 7, aer, 3, NULL, 0);
}

/* ---- Raft handshakes (fuzz_raft_handshake: flags, read sizes, the connector's bytes, then
 * the listener's) ------------------------------------------------------------------------- */

/* raft_uv_tcp's handshake of node `id` at `addr`: protocol, ID, address length (padded to
 * 8), then the address. */
static size_t hello(uint8_t *p, uint64_t protocol, uint64_t id, const char *addr)
{
    size_t al = (strlen(addr) + 1 + 7) / 8 * 8;
    size_t n = le(p, protocol, 8);
    n += le(p + n, id, 8);
    n += le(p + n, al, 8);
    memset(p + n, 0, al);
    memcpy(p + n, addr, strlen(addr));
    return n + al;
}

static void writeHandshake(const char *name, uint8_t flags, uint64_t target, uint64_t refusal_id)
{
    uint8_t buf[512] = {flags, 0x5c};
    size_t n = 2 + hello(buf + 2, TRANSPORT_HANDSHAKE_PROTOCOL, 1, "127.0.0.1:9001");
    if (flags & 1) {
        /* The connector's answer: nonce_c naming the target, then its MACs (planted by the
         * fuzzer when flags ask for it). */
        memcpy(buf + n, TRANSPORT_TARGET_MAGIC, 8);
        le(buf + n + 8, target, 8);
        memset(buf + n + 16, 0x3c, TRANSPORT_NONCE_LEN - 16);
        memset(buf + n + TRANSPORT_NONCE_LEN, 0, TRANSPORT_ANSWER_LEN - TRANSPORT_NONCE_LEN);
        n += TRANSPORT_ANSWER_LEN;
        /* The listener's greeting, then its answer (planted likewise). */
        memcpy(buf + n, TRANSPORT_AUTH_MAGIC, 8);
        memset(buf + n + 8, 0x77, TRANSPORT_NONCE_LEN);
        n += TRANSPORT_GREETING_LEN;
        memset(buf + n, 0, TRANSPORT_MAC_LEN);
        le(buf + n, refusal_id, 8);
        n += TRANSPORT_MAC_LEN;
    }
    writeFile("fuzz_raft_handshake", name, buf, n);
}

static void handshakeSeeds(void)
{
    writeHandshake("plain", 0, 0, 0);
    writeHandshake("auth", 1 | 4 | 0x20, 2, 0);
    writeHandshake("auth-previous-key", 1 | 2 | 4 | 8 | 16 | 0x20, 2, 0);
    writeHandshake("auth-refused-as-other", 1 | 2 | 4 | 0x20 | 0x40, 2, 5);
    writeHandshake("auth-other-target", 1, 3, 0);
    uint8_t buf[512] = {0, 1};
    size_t n = 2 + hello(buf + 2, 2, 1, "127.0.0.1:9001");
    writeFile("fuzz_raft_handshake", "bad-protocol", buf, n);
    n = 2 + hello(buf + 2, TRANSPORT_HANDSHAKE_PROTOCOL, 1, "127.0.0.1:9001");
    memset(buf + n - 8, 'x', 8);
    writeFile("fuzz_raft_handshake", "unterminated", buf, n);
    le(buf + 2 + 16, TRANSPORT_ADDRESS_MAX + 1, 8);
    writeFile("fuzz_raft_handshake", "address-too-long", buf, 2 + 24);
}

/* Frames past or at the walk's limits (fuzz_rpc_scan only): a get followed by 2,000
 * repetitions of deadline_ms (past RPC_SCAN_MAX_FIELDS), and a complete whose stored
 * response holds 1,000 empty headers (within it). */
static void scanSeeds(void)
{
    static uint8_t buf[8192];
    size_t n = 0;
    const uint8_t head[] = {0x08, 0x07, 0x1a, 0x01, 't', 0x72, 0x03, 0x0a, 0x01, 'k'};
    memcpy(buf, head, sizeof head);
    n = sizeof head;
    for (int i = 0; i < 2000; i++) {
        buf[n++] = 0x10; /* deadline_ms */
        buf[n++] = 0x01;
    }
    writeFile("fuzz_rpc_scan", "many_fields", buf, n);
    /* Request.complete (11) { CompleteRequest.response (4) { 1000 x headers (2) {} } } */
    n = 0;
    buf[n++] = 0x08;
    buf[n++] = 0x07;
    buf[n++] = 0x5a; /* field 11, length-delimited: 2000 + 3 bytes follow */
    buf[n++] = 0xd3;
    buf[n++] = 0x0f;
    buf[n++] = 0x22; /* field 4, length-delimited: 2000 bytes follow */
    buf[n++] = 0xd0;
    buf[n++] = 0x0f;
    for (int i = 0; i < 1000; i++) {
        buf[n++] = 0x12;
        buf[n++] = 0x00;
    }
    writeFile("fuzz_rpc_scan", "many_headers", buf, n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    corpus = argv[1];
    memset(fpBytes, 0xab, sizeof fpBytes);
    commandSeeds();
    requestSeeds();
    responseSeeds();
    messageSeeds();
    handshakeSeeds();
    scanSeeds();
    return 0;
}
