/* fsm_snapshot: the state machine's snapshot writer and its validating reader.
 *
 * Layout (idem.proto, SnapshotHeader): "IDEMSNAP", a u32 format, a varint-delimited
 * SnapshotHeader, record_count varint-delimited Records, and an XXH3-64 of every byte
 * before it. Each record is packed on its own from a stack message that borrows the
 * table's memory, so writing allocates nothing per record; reading decodes each record
 * into the arena and resets it, so restore costs no malloc per record beyond the record.
 *
 * The reader treats the bytes as untrusted (a snapshot comes from disk or from another
 * node): every length is bounded by what is left, every field is validated, and on any
 * error the running state machine is left exactly as it was. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "key.h"
#include "fsm_internal.h"
#include "xmalloc.h"

#define SNAP_MAGIC "IDEMSNAP"
#define SNAP_MAGIC_LEN 8
#define SNAP_FORMAT 1u
#define SNAP_TRAILER 8
#define SNAP_HEADER_MAX (16u << 20)
#define RESTORE_BATCH 16 /* records decoded before their slots are probed (restoreInto) */

/* ---- writer -------------------------------------------------------------------------- */

struct snapBuf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

static void bufReserve(struct snapBuf *b, size_t more)
{
    if (b->cap - b->len >= more) {
        return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < more) {
        cap *= 2;
    }
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

static void bufVarint(struct snapBuf *b, uint64_t v)
{
    bufReserve(b, 10);
    while (v >= 0x80) {
        b->p[b->len++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b->p[b->len++] = (uint8_t)v;
}

static void bufLE(struct snapBuf *b, uint64_t v, int bytes)
{
    bufReserve(b, (size_t)bytes);
    for (int i = 0; i < bytes; i++) {
        b->p[b->len++] = (uint8_t)(v >> (8 * i));
    }
}

/* Appends a varint length and the packed message. */
static void bufMessage(struct snapBuf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    bufVarint(b, n);
    bufReserve(b, n);
    size_t w = protobuf_c_message_pack(m, b->p + b->len);
    assert(w == n);
    b->len += w;
}

static void snapRecord(const struct rec *r, void *arg)
{
    struct snapBuf *b = arg;
    Idem__Record m = IDEM__RECORD__INIT;
    m.key.data = (uint8_t *)r->key;
    m.key.len = r->key_len;
    m.fingerprint.data = (uint8_t *)r->fp;
    m.fingerprint.len = sizeof(r->fp);
    m.state = (Idem__RecordState)r->state;
    m.token = r->token;
    m.created_at_ms = r->created_at;
    m.lease_deadline_ms = r->lease_deadline;
    m.expires_at_ms = r->expires_at;
    if (r->has_attempt) {
        m.attempt_digest.data = (uint8_t *)r->attempt;
        m.attempt_digest.len = sizeof(r->attempt);
    }
    m.tombstone_ttl_ms = r->tombstone_ttl;
    m.completion = (Idem__Completion)r->completion;
    if (r->response != NULL) {
        m.response.data = r->response + sizeof(uint32_t);
        m.response.len = fsm_rec_response_len(r);
    }
    m.tenant_index = r->tenant;
    bufMessage(b, &m.base);
}

/* What a snapshot is written from: the live table (fsm_snapshot) or a frozen view. */
struct snapView {
    const uintptr_t *slots;
    size_t mask;
    const uintptr_t *old;    /* the live table's array being migrated from, or NULL */
    size_t old_mask;
    uint64_t count;
    char **names;
    size_t n_tenants;
    uint64_t clock;
    uint64_t last_index;
    uint64_t bytes;
};

static void writeView(const struct snapView *v, uint8_t **out, size_t *out_len)
{
    struct snapBuf b = {NULL, 0, 0};
    /* A record packs to about 60 bytes plus key, fingerprint and response: reserve that
     * up front so that the buffer is not copied while it grows. */
    bufReserve(&b, 4096 + v->count * 112 + (size_t)v->bytes);
    memcpy(b.p, SNAP_MAGIC, SNAP_MAGIC_LEN);
    b.len = SNAP_MAGIC_LEN;
    bufLE(&b, SNAP_FORMAT, 4);

    Idem__SnapshotHeader h = IDEM__SNAPSHOT_HEADER__INIT;
    h.format = SNAP_FORMAT;
    h.clock_ms = v->clock;
    h.record_count = v->count;
    h.n_tenants = v->n_tenants;
    h.tenants = v->names;
    h.last_index = v->last_index;
    bufMessage(&b, &h.base);

    table_slots_foreach(v->slots, v->mask, snapRecord, &b);
    if (v->old != NULL) {
        table_slots_foreach(v->old, v->old_mask, snapRecord, &b);
    }
    bufLE(&b, XXH3_64bits(b.p, b.len), SNAP_TRAILER);
    *out = b.p;
    *out_len = b.len;
}

int fsm_snapshot(const struct fsm *f, uint8_t **out, size_t *out_len)
{
    char **names = xcalloc(f->t.n_tenants ? f->t.n_tenants : 1, sizeof(*names));
    for (size_t i = 0; i < f->t.n_tenants; i++) {
        names[i] = f->t.tenants[i].name;
    }
    struct snapView v = {
        .slots = f->t.slots,
        .mask = f->t.mask,
        .old = f->t.old,
        .old_mask = f->t.old_mask,
        .count = f->t.count,
        .names = names,
        .n_tenants = f->t.n_tenants,
        .clock = f->clock,
        .last_index = f->last_index,
        .bytes = f->bytes,
    };
    writeView(&v, out, out_len);
    free(names);
    return 0;
}

/* ---- frozen views (fsm.h, fsm_freeze) ------------------------------------------------ */

bool fsm_freeze_ready(struct fsm *f)
{
    return table_settle_step(&f->t, FSM_SETTLE_STEP);
}

struct fsm_frozen *fsm_freeze(struct fsm *f)
{
    if (f->frozen != NULL) {
        return NULL;
    }
    /* The view is one slot array: a growth in progress is finished first (table.h). */
    table_settle(&f->t);
    xbig_prefault_wait(&f->spare_pf);
    struct fsm_frozen *z = xcalloc(1, sizeof(*z));
    size_t n = f->t.mask + 1;
    /* Into the last view's copy when it has room (and is not far too big, after a restore
     * of a smaller table): this runs on the loop, and copying 16 MB of slots into memory
     * already mapped took 2 ms on the 2-core VM, into a fresh allocation 10-15 ms (the
     * page faults). The table's slot array only grows, so that is every snapshot but the
     * first after a growth. */
    if (f->spare_slots != NULL && f->spare_n >= n && f->spare_n / 4 < n) {
        z->slots = f->spare_slots;
        z->slots_cap = f->spare_n;
    } else {
        xbig_free(f->spare_slots, f->spare_n * sizeof(*f->spare_slots));
        z->slots = xbig_zalloc(n * sizeof(*z->slots));
        z->slots_cap = n;
    }
    f->spare_slots = NULL;
    f->spare_n = 0;
    f->spare_faulted = 0;
    memcpy(z->slots, f->t.slots, n * sizeof(*z->slots));
    z->mask = f->t.mask;
    z->count = f->t.count;
    /* Tenant names are never freed nor changed while the table lives (a restore during the
     * freeze keeps the old table until the thaw), so their addresses are enough. */
    z->n_tenants = f->t.n_tenants;
    z->names = xmalloc((z->n_tenants ? z->n_tenants : 1) * sizeof(*z->names));
    for (size_t i = 0; i < z->n_tenants; i++) {
        z->names[i] = f->t.tenants[i].name;
    }
    z->clock = f->clock;
    z->last_index = f->last_index;
    z->bytes = f->bytes;
    f->frozen = z;
    return z;
}

void fsm_spare_step(struct fsm *f)
{
    size_t n = f->t.mask + 1;
    size_t next = table_next_bytes(&f->t) / sizeof(*f->spare_slots);
    if (next > n) {
        n = next;
    }
    size_t bytes = n * sizeof(*f->spare_slots);
    if (f->frozen != NULL || bytes < XBIG_MAP_MIN_BYTES) {
        return;
    }
    if (f->spare_n < n) {
        /* Grown in place where it can be: mremap(2) moves the pages already faulted in
         * instead of freeing them (an 8 MiB munmap took ~1 ms). Its content is never read
         * before a freeze's copy overwrites it. */
        xbig_prefault_wait(&f->spare_pf);
        size_t had = f->spare_n * sizeof(*f->spare_slots);
        f->spare_slots = xbig_grow(f->spare_slots, had, bytes);
        f->spare_n = n;
        if (had < XBIG_MAP_MIN_BYTES) {
            f->spare_faulted = 0; /* copied into a fresh mapping */
        }
    }
    /* Faulted in by the prefaulter (xbig_prefault): what a growth added, or what the last view's
     * copy did not cover. */
    size_t total = f->spare_n * sizeof(*f->spare_slots);
    if (f->spare_faulted < total && !xbig_prefault_running(&f->spare_pf)) {
        xbig_prefault_start(&f->spare_pf, f->spare_slots, f->spare_faulted, total);
        f->spare_faulted = total;
    }
}

int fsm_frozen_write(const struct fsm_frozen *z, uint8_t **out, size_t *out_len)
{
    struct snapView v = {
        .slots = z->slots,
        .mask = z->mask,
        .count = z->count,
        .names = z->names,
        .n_tenants = z->n_tenants,
        .clock = z->clock,
        .last_index = z->last_index,
        .bytes = z->bytes,
    };
    writeView(&v, out, out_len);
    return 0;
}

uint64_t fsm_frozen_records(const struct fsm_frozen *z)
{
    return z->count;
}

void fsm_frozen_retire(struct fsm_frozen *z, struct rec *r)
{
    if (z->n_retired == z->cap_retired) {
        z->cap_retired = z->cap_retired ? z->cap_retired * 2 : 256;
        z->retired = xrealloc(z->retired, z->cap_retired * sizeof(*z->retired));
    }
    z->retired[z->n_retired++] = r;
}

void fsm_thaw(struct fsm *f, struct fsm_frozen *z)
{
    assert(f->frozen == z);
    for (size_t i = 0; i < z->n_retired; i++) {
        table_rec_free(z->retired[i]);
    }
    for (size_t i = 0; i < z->n_graves; i++) {
        table_close(&z->graves[i]);
    }
    free(z->retired);
    free(z->graves);
    assert(!xbig_prefault_running(&f->spare_pf)); /* waited for by the freeze */
    f->spare_slots = z->slots; /* for the next freeze; none is kept meanwhile (fsm_freeze) */
    f->spare_n = z->slots_cap;
    f->spare_faulted = (z->mask + 1) * sizeof(*z->slots); /* what the freeze copied */
    free(z->names);
    free(z);
    f->frozen = NULL;
}

/* ---- reader -------------------------------------------------------------------------- */

struct snapReader {
    const uint8_t *p;
    size_t len; /* bytes before the trailer */
    size_t pos;
};

static bool readVarint(struct snapReader *rd, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (rd->pos >= rd->len) {
            return false;
        }
        uint8_t byte = rd->p[rd->pos++];
        x |= (uint64_t)(byte & 0x7f) << shift;
        if ((byte & 0x80) == 0) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* The next varint-delimited message's bytes, bounded by what is left. */
static bool readDelimited(struct snapReader *rd, const uint8_t **p, size_t *n)
{
    uint64_t len;
    if (!readVarint(rd, &len) || len > rd->len - rd->pos) {
        return false;
    }
    *p = rd->p + rd->pos;
    *n = (size_t)len;
    rd->pos += (size_t)len;
    return true;
}

static uint64_t readLE(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

/* Validates one decoded record against the snapshot's header (its stored response decoded
 * into scratch). */
static const char *validateRecord(const struct fsm *f, const Idem__Record *m, struct arena *scratch)
{
    if (m->tenant_index >= f->t.n_tenants) {
        return "record names an unknown tenant";
    }
    if (key_validate(m->key.data, m->key.len, KEY_MAX_LEN) != KEY_OK) {
        return "record key invalid";
    }
    if (m->fingerprint.len != FSM_FINGERPRINT_LEN) {
        return "record fingerprint not 32 bytes";
    }
    if (m->state < IDEM__RECORD_STATE__RECORD_STATE_PROCESSING ||
        m->state > IDEM__RECORD_STATE__RECORD_STATE_RELEASED) {
        return "record state invalid";
    }
    if ((unsigned)m->completion > IDEM__COMPLETION__COMPLETION_UNKNOWN) {
        return "record completion invalid";
    }
    /* The completion must be one that apply can have left with this state. */
    switch (m->state) {
    case IDEM__RECORD_STATE__RECORD_STATE_PROCESSING:
    case IDEM__RECORD_STATE__RECORD_STATE_RELEASED:
        if (m->completion != IDEM__COMPLETION__COMPLETION_UNSPECIFIED) {
            return "record completion does not fit its state";
        }
        break;
    case IDEM__RECORD_STATE__RECORD_STATE_COMPLETED:
        if (m->completion != IDEM__COMPLETION__COMPLETION_SUCCEEDED &&
            m->completion != IDEM__COMPLETION__COMPLETION_FAILED_FINAL) {
            return "record completion does not fit its state";
        }
        break;
    case IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED:
        if (m->completion != IDEM__COMPLETION__COMPLETION_UNKNOWN) {
            return "record completion does not fit its state";
        }
        break;
    default:
        break; /* a tombstone keeps the completion it had */
    }
    if (m->attempt_digest.len != 0 && m->attempt_digest.len != 16) {
        return "record attempt digest not 16 bytes";
    }
    if (m->token == 0 || m->token > f->last_index) {
        return "record token beyond the snapshot's last index";
    }
    if (m->tombstone_ttl_ms == 0) {
        return "record tombstone ttl is zero";
    }
    bool has_response = m->response.len > 0;
    bool needs_response = m->state == IDEM__RECORD_STATE__RECORD_STATE_COMPLETED;
    bool may_have_response = needs_response ||
                             m->state == IDEM__RECORD_STATE__RECORD_STATE_QUARANTINED;
    if (needs_response && !has_response) {
        return "completed record without a response";
    }
    if (has_response && !may_have_response) {
        return "record holds a response in a state that keeps none";
    }
    if (has_response) {
        if (m->response.len > FSM_RESPONSE_MAX) {
            return "record response too large";
        }
        const char *why = NULL;
        Idem__StoredResponse *resp =
            idem__stored_response__unpack(&scratch->pb, m->response.len, m->response.data);
        if (resp == NULL) {
            return "record response malformed";
        }
        if (!fsm_response_valid(resp, &why)) {
            return why;
        }
    }
    return NULL;
}

/* Inserts a validated record, whose hash is h, unless its key is taken. */
static const char *insertRecord(struct fsm *f, const Idem__Record *m, uint64_t h)
{
    int tn = (int)m->tenant_index;
    if (table_find(&f->t, tn, h, m->key.data, m->key.len) != NULL) {
        return "duplicate record";
    }
    struct rec *r = table_insert(&f->t, tn, h, m->key.data, m->key.len);
    memcpy(r->fp, m->fingerprint.data, FSM_FINGERPRINT_LEN);
    r->state = (uint8_t)m->state;
    r->completion = (uint8_t)m->completion;
    r->token = m->token;
    r->created_at = m->created_at_ms;
    r->lease_deadline = m->lease_deadline_ms;
    r->expires_at = m->expires_at_ms;
    r->tombstone_ttl = m->tombstone_ttl_ms;
    r->has_attempt = m->attempt_digest.len == 16;
    if (r->has_attempt) {
        memcpy(r->attempt, m->attempt_digest.data, 16);
    }
    if (m->response.len > 0) {
        uint8_t *stored = xmalloc(sizeof(uint32_t) + m->response.len);
        uint32_t n32 = (uint32_t)m->response.len;
        memcpy(stored, &n32, sizeof(n32));
        memcpy(stored + sizeof(uint32_t), m->response.data, m->response.len);
        r->response = stored;
    }
    expiry_append(&f->t.heap, r); /* ordered once all are in (restoreInto) */
    fsm_rec_count(f, r);
    return NULL;
}

static const char *restoreInto(struct fsm *f, const uint8_t *buf, size_t len)
{
    if (buf == NULL || len < SNAP_MAGIC_LEN + 4 + SNAP_TRAILER) {
        return "snapshot too short";
    }
    if (memcmp(buf, SNAP_MAGIC, SNAP_MAGIC_LEN) != 0) {
        return "not an idemd snapshot";
    }
    if (readLE(buf + SNAP_MAGIC_LEN, 4) != SNAP_FORMAT) {
        return "unsupported snapshot format";
    }
    size_t body = len - SNAP_TRAILER;
    if (readLE(buf + body, SNAP_TRAILER) != XXH3_64bits(buf, body)) {
        return "snapshot checksum mismatch";
    }
    struct snapReader rd = {buf, body, SNAP_MAGIC_LEN + 4};
    const uint8_t *p;
    size_t n;
    if (!readDelimited(&rd, &p, &n) || n > SNAP_HEADER_MAX) {
        return "snapshot header truncated";
    }
    Idem__SnapshotHeader *h = idem__snapshot_header__unpack(NULL, n, p);
    if (h == NULL) {
        return "snapshot header malformed";
    }
    const char *err = NULL;
    if (h->format != SNAP_FORMAT) {
        err = "snapshot header format mismatch";
        goto out;
    }
    if (h->n_tenants > FSM_TENANTS_MAX) {
        err = "too many tenants";
        goto out;
    }
    for (size_t i = 0; i < h->n_tenants; i++) {
        size_t tl = strlen(h->tenants[i]);
        if (tl == 0 || tl > FSM_TENANT_MAX || table_tenant_find(&f->t, h->tenants[i], tl) >= 0) {
            err = "tenant name empty, too long or repeated";
            goto out;
        }
        if (table_tenant_intern(&f->t, h->tenants[i], tl) != (int)i) {
            err = "tenant table full";
            goto out;
        }
    }
    f->clock = h->clock_ms;
    f->last_index = h->last_index;
    /* Each record takes at least 40 bytes (key, fingerprint, state, token, ttl), so a count
     * larger than that allows is refused before it sizes anything. */
    if (h->record_count > (rd.len - rd.pos) / 40) {
        err = "record count larger than the snapshot";
        goto out;
    }
    table_reserve(&f->t, (size_t)h->record_count);
    /* Records go in by batches: each batch's are decoded, validated and hashed, and their
     * home slots prefetched, before any is looked up and inserted, so that the cache and TLB
     * misses of a batch's probes (a random slot each, of a 16 MiB array at 1M records)
     * overlap instead of costing one full memory latency each. */
    for (uint64_t i = 0; i < h->record_count;) {
        arena_reset(&f->arena);
        const Idem__Record *batch[RESTORE_BATCH];
        uint64_t hash[RESTORE_BATCH];
        size_t k = 0;
        for (; k < RESTORE_BATCH && i < h->record_count; k++, i++) {
            if (!readDelimited(&rd, &p, &n)) {
                err = "snapshot truncated";
                goto out;
            }
            Idem__Record *m = idem__record__unpack(&f->arena.pb, n, p);
            if (m == NULL) {
                err = "record malformed";
                goto out;
            }
            err = validateRecord(f, m, &f->arena);
            if (err != NULL) {
                goto out;
            }
            batch[k] = m;
            hash[k] = table_hash(&f->t, (int)m->tenant_index, m->key.data, m->key.len);
            table_prefetch(&f->t, hash[k]);
        }
        for (size_t j = 0; j < k; j++) {
            err = insertRecord(f, batch[j], hash[j]);
            if (err != NULL) {
                goto out;
            }
        }
    }
    if (rd.pos != rd.len) {
        err = "trailing bytes after the last record";
        goto out;
    }
    expiry_heapify(&f->t.heap);
out:
    arena_reset(&f->arena);
    idem__snapshot_header__free_unpacked(h, NULL);
    return err;
}

int fsm_restore(struct fsm *f, const uint8_t *buf, size_t len, const char **why)
{
    struct fsm *fresh = fsm_new_with(&f->opt);
    const char *err = restoreInto(fresh, buf, len);
    if (err != NULL) {
        fsm_close(fresh);
        if (why != NULL) {
            *why = err;
        }
        return -1;
    }
    /* Swap the replicated state (not the arenas, which point at themselves); the old
     * state is freed with `fresh`. */
    struct fsm tmp = *f;
    f->t = fresh->t;
    f->clock = fresh->clock;
    f->last_index = fresh->last_index;
    memcpy(f->n_state, fresh->n_state, sizeof(f->n_state));
    f->bytes = fresh->bytes;
    if (f->frozen != NULL) {
        /* The frozen view still reads the old table's records and tenant names: keep the
         * old table until the thaw. No record of the new one is the view's. */
        struct fsm_frozen *z = f->frozen;
        z->graves = xrealloc(z->graves, (z->n_graves + 1) * sizeof(*z->graves));
        z->graves[z->n_graves++] = tmp.t;
        z->detached = true;
        table_init(&fresh->t, f->opt.prefault, f->opt.hash_secret);
    } else {
        fresh->t = tmp.t;
    }
    fsm_close(fresh);
    return 0;
}
