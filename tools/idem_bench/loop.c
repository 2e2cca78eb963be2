/* loop: the engine of idem-bench's open loop (--rate) and of its default closed loop.
 *
 * It sends from a single thread: a libuv loop with --connections asynchronous clients (each
 * pipelines its requests over one connection to the leader), used round robin. A 1 ms timer
 * sends every operation that is due (scheduled at or before now; in the closed loop, every
 * free slot's) while fewer than --concurrency are in flight; an answer that frees a slot
 * sends the next due operation at once. So the generator adds no runnable threads of its
 * own next to the cluster it measures: what it reports is the cluster's, not the
 * scheduler's. Before the schedule starts, each client makes one call (a get) so that its
 * connection to the leader is up; after the end, the grace (main.c) bounds what is still
 * sent and answered. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <uv.h>

#include "bench.h"

#define OPEN_TICK_MS 1

struct open_loop;

/* One operation in flight; a pool of --concurrency of them. */
struct open_op {
    struct open_loop *L;
    struct idem_async *a; /* the client it went out on (the pair's second call too) */
    SLIST_ENTRY(open_op) free_link; /* in open_loop.free_ops while not in flight */
    struct op_names names; /* its key (one of the set's or its own), attempt id, fingerprint */
    uint64_t sched_us;
    uint64_t sent_us;
    uint64_t token;
};

struct open_loop {
    struct bench *b;
    uv_loop_t loop;
    uv_timer_t tick;
    uv_timer_t progress;
    bool progress_on;
    struct idem_async **conns;
    unsigned nconns;
    unsigned rr;
    unsigned closing; /* clients whose close has not finished */
    struct open_op *ops;
    SLIST_HEAD(, open_op) free_ops;
    unsigned inflight;
    unsigned warming; /* warm-up calls not answered yet */
    bool started;     /* the schedule runs */
    bool finishing;   /* no more sends; close once nothing is in flight */
    bool closed;      /* the clients and timers are closing */
    bool pumping;     /* openPump is running (an operation refused at once re-enters) */
    uint64_t next;     /* the next operation to send */
    uint64_t expected; /* operations scheduled in all */
    /* progress: when it was last printed, and the ops (succeeded) then */
    uint64_t last_print, last_done;
    struct worker w; /* the counters and histograms, as one closed-loop worker's */
    uv_timer_t timeline; /* --timeline: closes an interval */
    struct hist tl_hist; /* the interval's latencies */
};

static void openPump(struct open_loop *L);

/* Open loop: the scheduled time of operation i, i / rate seconds after the start, in µs,
 * without overflow for any i we can reach. */
static uint64_t schedUs(const struct bench *b, uint64_t i)
{
    uint64_t r = b->cfg.rate;
    return b->start_us + i / r * 1000000u + (i % r) * 1000000u / r;
}

/* Ends the current --timeline interval: its row is appended (even when empty, so that a
 * stall shows as rows without operations). */
static void timelineRoll(struct open_loop *L)
{
    struct bench *b = L->b;
    if (b->n_timeline == b->cap_timeline) {
        size_t cap = b->cap_timeline ? b->cap_timeline * 2 : 64;
        struct tl_row *rows = realloc(b->timeline, cap * sizeof *rows);
        if (rows == NULL) {
            return; /* the timeline stops growing; the run goes on */
        }
        b->timeline = rows;
        b->cap_timeline = cap;
    }
    const struct hist *h = &L->tl_hist;
    uint64_t now = bench_now_us();
    b->timeline[b->n_timeline++] = (struct tl_row){
        .end_ms = now > b->start_us ? (now - b->start_us + 500) / 1000 : 0,
        .ops = h->total,
        .p50_us = hist_percentile(h, 50),
        .p99_us = hist_percentile(h, 99),
        .max_us = h->total ? h->max : 0,
    };
    if (b->probe != NULL) {
        struct stallprobe_window win;
        stallprobe_take(b->probe, &win);
        b->timeline[b->n_timeline - 1].held_max_us = win.max_us;
    }
    hist_init(&L->tl_hist);
}

static void timelineCb(uv_timer_t *t)
{
    timelineRoll(t->data);
}

static void openCloseCb(struct idem_async *a, void *data)
{
    (void)a;
    struct open_loop *L = data;
    L->closing--;
}

/* Operations scheduled but never sent (the run fell behind and the extra deadline ran out)
 * waited at least from their scheduled time until now: they count in the latency with that
 * wait, as well as in `unsent`, so that a run that stalls cannot show a better tail than
 * one that answered late. */
static void recordUnsent(struct open_loop *L)
{
    uint64_t now = bench_now_us();
    for (uint64_t i = L->next; i < L->expected; i++) {
        uint64_t sched = schedUs(L->b, i);
        if (sched > now) {
            break;
        }
        hist_record(&L->w.hist, now - sched);
        if (L->b->cfg.timeline_ms != 0) {
            hist_record(&L->tl_hist, now - sched);
        }
    }
}

/* Stops the timers and closes the clients; the loop ends when they are closed. */
static void openFinish(struct open_loop *L)
{
    L->finishing = true;
    if (L->closed || L->inflight > 0 || L->warming > 0) {
        return; /* every call ends by its deadline; the last one comes back here */
    }
    L->closed = true;
    if (L->started && L->b->cfg.rate != 0) {
        recordUnsent(L);
    }
    uv_timer_stop(&L->tick);
    uv_timer_stop(&L->progress);
    if (L->b->cfg.timeline_ms != 0 && L->started) {
        uv_timer_stop(&L->timeline);
        if (L->tl_hist.total > 0) {
            timelineRoll(L); /* the last, partial interval */
        }
    }
    uv_close((uv_handle_t *)&L->timeline, NULL);
    L->closing = L->nconns;
    for (unsigned i = 0; i < L->nconns; i++) {
        idem_async_close(L->conns[i], openCloseCb, L);
    }
    uv_close((uv_handle_t *)&L->tick, NULL);
    uv_close((uv_handle_t *)&L->progress, NULL);
}

/* An operation ended (ok: every call got its expected outcome): it is timed and its slot
 * freed. */
static void openDone(struct open_op *op, bool ok)
{
    struct open_loop *L = op->L;
    struct worker *w = &L->w;
    uint64_t t1 = bench_now_us();
    /* As in the closed loop, failed operations count in the latency too. */
    hist_record(&w->hist, t1 - op->sched_us);
    hist_record(&w->service, t1 - op->sent_us);
    if (L->b->cfg.timeline_ms != 0) {
        hist_record(&L->tl_hist, t1 - op->sched_us);
    }
    workload_finish(w, ok);
    SLIST_INSERT_HEAD(&L->free_ops, op, free_link);
    L->inflight--;
    if (L->finishing) {
        openFinish(L);
    } else {
        openPump(L);
    }
}

/* Counts one call's end; on anything but `want` notes the first error and returns false. */
static bool openCall(struct open_op *op, const char *what, int status,
                     const struct idem_result *r, int want, bool first)
{
    struct worker *w = &op->L->w;
    workload_count_call(w, status);
    if (first) {
        w->outcomes[workload_outcome_slot(status, status == IDEM_OK ? (Idem__Outcome)r->outcome
                                                          : IDEM__OUTCOME__OUTCOME_UNSPECIFIED)]++;
    }
    if (status != IDEM_OK) {
        workload_note_error(w, "%s: %s: %s", what, idem_strerror(status), r->detail);
        return false;
    }
    if (r->outcome != want) {
        workload_note_error(w, "%s: %s%s%s", what, idem_outcome_name(r->outcome),
                  r->detail[0] ? ": " : "", r->detail);
        return false;
    }
    return true;
}

static void openSecondCb(struct idem_async *a, int status, struct idem_result *r, void *data)
{
    (void)a;
    struct open_op *op = data;
    const char *what = op->L->b->cfg.workload == WL_CONTENTION ? "release" : "complete";
    openDone(op, openCall(op, what, status, r, IDEM_OUTCOME_OK, false));
}

static void openClaimCb(struct idem_async *a, int status, struct idem_result *r, void *data)
{
    struct open_op *op = data;
    struct open_loop *L = op->L;
    enum workload wl = L->b->cfg.workload;
    uint32_t dl = bench_call_deadline(L->b);
    if (wl == WL_CONTENTION && status == IDEM_OK && r->outcome == IDEM_OUTCOME_IN_PROGRESS) {
        openCall(op, "claim", status, r, IDEM_OUTCOME_IN_PROGRESS, true);
        openDone(op, true);
        return;
    }
    int want = wl == WL_REPLAY ? IDEM_OUTCOME_REPLAY : IDEM_OUTCOME_ACQUIRED;
    if (!openCall(op, "claim", status, r, want, true)) {
        openDone(op, false);
        return;
    }
    if (wl == WL_REPLAY || wl == WL_FRESH) {
        openDone(op, true);
        return;
    }
    op->token = r->token;
    const char *key = workload_key(&op->names);
    if (!bench_follow_up_fits(L->b)) {
        workload_note_error(&L->w, "%s: " CUT_OFF, wl == WL_CLAIM_COMPLETE ? "complete" : "release");
        openDone(op, false);
        return;
    }
    int rv;
    if (wl == WL_CLAIM_COMPLETE) {
        static const uint8_t body[] = "ok";
        struct idem_response resp = {.status = 200, .body = body, .body_len = 2};
        rv = idem_async_complete(a, key, op->token, IDEM_COMPLETION_SUCCEEDED, &resp, dl,
                                 openSecondCb, op);
    } else {
        rv = idem_async_release(a, key, op->token, dl, openSecondCb, op);
    }
    if (rv != IDEM_OK) {
        workload_count_call(&L->w, rv);
        workload_note_error(&L->w, "%s: %s", wl == WL_CLAIM_COMPLETE ? "complete" : "release",
                  idem_strerror(rv));
        openDone(op, false);
    }
}

/* Sends operation L->next (due now) on the next client. */
static void openSend(struct open_loop *L, uint64_t sched, uint64_t now)
{
    struct bench *b = L->b;
    struct worker *w = &L->w;
    struct open_op *op = SLIST_FIRST(&L->free_ops);
    SLIST_REMOVE_HEAD(&L->free_ops, free_link);
    uint64_t i = L->next++;
    op->a = L->conns[L->rr++ % L->nconns];
    op->sched_us = sched;
    op->sent_us = now;
    op->token = 0;
    if (now - sched > atomic_load_explicit(&b->max_lag, memory_order_relaxed)) {
        atomic_store_explicit(&b->max_lag, now - sched, memory_order_relaxed);
    }
    workload_name_op(w, true, i, &op->names);
    struct idem_claim_opts co = {.attempt_id = op->names.attempt,
                                 .deadline_ms = bench_call_deadline(b)};
    L->inflight++;
    int rv = idem_async_claim(op->a, workload_key(&op->names), workload_fp(&op->names), &co,
                              openClaimCb, op);
    if (rv != IDEM_OK) {
        workload_count_call(w, rv);
        w->outcomes[OUTC_NONE]++;
        workload_note_error(w, "claim: %s", idem_strerror(rv));
        openDone(op, false);
    }
}

/* Sends every operation that is due while the in-flight cap allows; finishes the run when
 * everything was sent and answered, or when it is over. */
static void openPump(struct open_loop *L)
{
    if (!L->started || L->finishing || L->pumping) {
        return;
    }
    uint64_t now = bench_now_us();
    bool closed = L->b->cfg.rate == 0;
    /* The closed loop sends nothing after the end; the open loop still sends what was
     * scheduled before it, for half the grace. */
    if (now >= (closed ? L->b->end_us : L->b->send_until_us)) {
        openFinish(L);
        return;
    }
    /* openSend may end an operation at once (a refused request), which calls back here:
     * the guard makes that a no-op, and this loop goes on. */
    L->pumping = true;
    while (L->next < L->expected && !SLIST_EMPTY(&L->free_ops) && !L->finishing) {
        uint64_t sched = closed ? now : schedUs(L->b, L->next);
        if (sched > now) {
            break;
        }
        openSend(L, sched, now);
        now = bench_now_us();
    }
    L->pumping = false;
    if (L->next >= L->expected && L->inflight == 0) {
        openFinish(L);
    }
}

static void openTickCb(uv_timer_t *t)
{
    openPump(t->data);
}

static void openProgressCb(uv_timer_t *t)
{
    struct open_loop *L = t->data;
    uint64_t now = bench_now_us();
    L->last_done = report_progress(L->b, now, L->last_print, L->last_done);
    L->last_print = now;
}

/* Starts the schedule once every client has its connection to the leader. */
static void openStart(struct open_loop *L)
{
    struct bench *b = L->b;
    L->started = true;
    bench_probe_start(b);
    bench_run_times(b, bench_now_us() + 1000u);
    L->last_print = b->start_us;
    uv_timer_start(&L->tick, openTickCb, OPEN_TICK_MS, OPEN_TICK_MS);
    if (L->progress_on) {
        uv_timer_start(&L->progress, openProgressCb, 1000, 1000);
    }
    if (b->cfg.timeline_ms != 0) {
        uv_timer_start(&L->timeline, timelineCb, b->cfg.timeline_ms, b->cfg.timeline_ms);
    }
}

/* The warm-up call of a client (a get of the probe key) came back: its connection to the
 * leader is up (or the call failed, and the run will show why). */
static void openWarmCb(struct idem_async *a, int status, struct idem_result *r, void *data)
{
    (void)a;
    (void)status;
    (void)r;
    struct open_loop *L = data;
    if (--L->warming == 0) {
        if (L->finishing) {
            openFinish(L);
        } else {
            openStart(L);
        }
    }
}

/* A loop for the run, its operation slots free, its timers made (not started); NULL (the
 * failure reported) when out of memory. */
static struct open_loop *loopNew(struct bench *b, const struct worker *w, bool progress)
{
    struct open_loop *L = calloc(1, sizeof *L);
    if (L == NULL) {
        bench_error("out of memory");
        return NULL;
    }
    L->b = b;
    L->w = *w;
    L->progress_on = progress;
    /* Closed loop: as many as the run's time allows, or --requests. */
    uint64_t expected = bench_expected(&b->cfg);
    L->expected = expected == 0 ? UINT64_MAX : expected;
    L->ops = calloc(b->cfg.concurrency, sizeof *L->ops);
    L->conns = calloc(b->cfg.connections, sizeof *L->conns);
    if (L->ops == NULL || L->conns == NULL || uv_loop_init(&L->loop) != 0) {
        bench_error("out of memory");
        free(L->ops);
        free(L->conns);
        free(L);
        return NULL;
    }
    SLIST_INIT(&L->free_ops);
    for (unsigned i = b->cfg.concurrency; i-- > 0;) {
        L->ops[i].L = L;
        SLIST_INSERT_HEAD(&L->free_ops, &L->ops[i], free_link);
    }
    uv_timer_init(&L->loop, &L->tick);
    uv_timer_init(&L->loop, &L->progress);
    uv_timer_init(&L->loop, &L->timeline);
    L->tick.data = L;
    L->progress.data = L;
    L->timeline.data = L;
    hist_init(&L->tl_hist);
    return L;
}

/* Opens the --connections clients on the loop: EXIT_RAN, or the exit status of the first
 * that cannot be made (reported; L->nconns counts those made). */
static int openClients(struct open_loop *L)
{
    struct bench *b = L->b;
    struct idem_options o = {0};
    o.seeds = b->cfg.cluster;
    o.token = b->cfg.token;
    o.default_deadline_ms = b->cfg.deadline_ms;
    cli_tls_options(&b->cfg.tls, &o);
    char why[256];
    for (unsigned i = 0; i < b->cfg.connections; i++) {
        int rv = idem_async_open(&L->loop, &o, &L->conns[i], why, sizeof why);
        if (rv != IDEM_OK) {
            bench_error("%s: %s", idem_strerror(rv), why);
            return rv == IDEM_EINVAL || rv == IDEM_ETLS ? EXIT_USAGE : EXIT_SETUP;
        }
        L->nconns++;
    }
    return EXIT_RAN;
}

/* Each client's warm-up call (a get of the probe key, a key nobody has): the schedule
 * starts once they are all back (at once if not one could be sent). */
static void warmUp(struct open_loop *L)
{
    char probe_key[96];
    snprintf(probe_key, sizeof probe_key, "bench-%s-probe", L->b->run_id);
    for (unsigned i = 0; i < L->nconns; i++) {
        if (idem_async_get(L->conns[i], probe_key, L->b->cfg.deadline_ms, openWarmCb, L) ==
            IDEM_OK) {
            L->warming++;
        }
    }
    if (L->warming == 0) {
        openStart(L);
    }
}

int loop_run(struct bench *b, struct worker *w, bool progress)
{
    struct open_loop *L = loopNew(b, w, progress);
    if (L == NULL) {
        return EXIT_SETUP;
    }
    int code = openClients(L);
    if (code == EXIT_RAN) {
        warmUp(L);
    } else {
        L->finishing = true;
    }
    if (L->finishing) {
        openFinish(L);
    }
    uv_run(&L->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&L->loop) != 0) {
        fputs("idem-bench: the event loop did not close cleanly\n", stderr);
    }
    if (code == EXIT_RAN) {
        *w = L->w;
        w->b = b;
    }
    free(L->ops);
    free(L->conns);
    free(L);
    return code;
}
