/* make_seeds: writes the binary seed corpora of the fuzz targets whose inputs are protobuf
 * bytes (fuzz_fsm_apply, fuzz_snapshot_restore, fuzz_rpc_request, fuzz_rpc_scan: the same
 * requests). The text seeds
 * (fuzz_config, fuzz_fingerprint) are written by hand.
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
#include "idem.pb-c.h"

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
    scanSeeds();
    return 0;
}
