/* report: idem-bench's results. The totals merged over the workers, the text summary (the
 * percentiles of every operation sent, failed ones included, the outcome counts, an ASCII
 * distribution of the latencies, the --timeline rows and the --stall-probe totals) or one
 * JSON object with --json, and the progress line written to stderr while the run goes on. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "bench.h"

/* ---- totals and progress ------------------------------------------------------------- */

void report_merge(struct totals *t, const struct worker *w)
{
    hist_merge(t->lat, &w->hist);
    hist_merge(t->svc, &w->service);
    t->ops += w->ops;
    t->errors += w->errors;
    t->transport += w->transport;
    t->answered += w->answered;
    for (size_t k = 0; k < OUTC_N; k++) {
        t->outcomes[k] += w->outcomes[k];
    }
    if (t->first_error == NULL && w->first_error[0] != '\0') {
        t->first_error = w->first_error;
    }
}

uint64_t report_progress(struct bench *b, uint64_t now, uint64_t last_print,
                         uint64_t last_done)
{
    /* ops as the summary counts them: the expected outcome; errors apart. */
    uint64_t d = atomic_load_explicit(&b->succeeded, memory_order_relaxed);
    uint64_t f = atomic_load_explicit(&b->failed, memory_order_relaxed);
    double el = now > b->start_us ? (double)(now - b->start_us) / 1e6 : 0;
    fprintf(stderr, "\r[%4.0fs] %" PRIu64 " ops, %.0f ops/s, %" PRIu64 " errors", el, d,
            (double)(d - last_done) * 1e6 / (double)(now - last_print), f);
    /* The lag behind the schedule: there is one only with --rate (the loop also runs the
     * closed loop without --threads). */
    if (b->cfg.rate != 0) {
        fprintf(stderr, ", max lag %.1f ms",
                bench_ms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
    }
    fputs("   ", stderr);
    return d;
}

static const char *outcomeLabel(size_t slot)
{
    if (slot == OUTC_NONE) {
        return "no_answer";
    }
    if (slot == OUTC_OTHER) {
        return "other";
    }
    return idem_outcome_name((int)slot);
}

/* ---- JSON ---------------------------------------------------------------------------- */

/* Out of memory while the JSON object is built: the run's results are lost. */
static void __attribute__((noreturn)) jsonOutOfMemory(void)
{
    fputs("idem-bench: out of memory\n", stderr);
    exit(EXIT_SETUP);
}

static json_t *jnew(json_t *v)
{
    if (v == NULL) {
        jsonOutOfMemory();
    }
    return v;
}

static void jset(json_t *o, const char *k, json_t *v)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0) {
        jsonOutOfMemory();
    }
}

static void jappend(json_t *a, json_t *v)
{
    if (v == NULL || json_array_append_new(a, v) != 0) {
        jsonOutOfMemory();
    }
}

static json_t *jint(uint64_t v)
{
    return json_integer((json_int_t)v);
}

/* Rounds to 3 decimals, so that JSON shows 1.234 rather than 1.2339999999999999. */
static double round3(double v)
{
    return (double)(int64_t)(v * 1000.0 + (v >= 0 ? 0.5 : -0.5)) / 1000.0;
}

/* A duration in µs as milliseconds with 3 decimals. */
static json_t *jms(uint64_t us)
{
    return json_real(round3(bench_ms(us)));
}

/* What was run: mode, workload, its key set, the in-flight cap, rate, threads, connections. */
static void jsonRun(json_t *o, const struct bench *b, const struct totals *t)
{
    jset(o, "mode", json_string(b->cfg.rate ? "open" : "closed"));
    jset(o, "workload", json_string(bench_workload_names[b->cfg.workload]));
    if (bench_uses_key_set(&b->cfg)) {
        jset(o, "keys", jint(b->cfg.keys));
    }
    jset(o, "concurrency", jint(t->threads));
    if (b->cfg.rate) {
        jset(o, "target_rate", jint(b->cfg.rate));
    }
    jset(o, "threads", json_boolean(b->cfg.threads));
    if (!b->cfg.threads) {
        jset(o, "connections", jint(b->cfg.connections));
    }
}

/* The counts and the latency figures; with --rate the service time, unsent and lag too. */
static void jsonFigures(json_t *o, struct bench *b, const struct totals *t)
{
    const struct hist *h = t->lat;
    double ops_s = t->elapsed_s > 0 ? (double)t->ops / t->elapsed_s : 0;
    jset(o, "ops_per_sec", json_real(round3(ops_s)));
    jset(o, "ops", jint(t->ops));
    jset(o, "errors", jint(t->errors));
    jset(o, "transport_errors", jint(t->transport));
    jset(o, "duration_s", json_real(round3(t->elapsed_s)));
    jset(o, "p50_ms", jms(hist_percentile(h, 50)));
    jset(o, "p90_ms", jms(hist_percentile(h, 90)));
    jset(o, "p99_ms", jms(hist_percentile(h, 99)));
    jset(o, "p999_ms", jms(hist_percentile(h, 99.9)));
    jset(o, "max_ms", jms(h->total ? h->max : 0));
    jset(o, "mean_ms", json_real(round3(hist_mean(h) / 1000.0)));
    if (b->cfg.rate) {
        jset(o, "service_p50_ms", jms(hist_percentile(t->svc, 50)));
        jset(o, "service_p99_ms", jms(hist_percentile(t->svc, 99)));
        jset(o, "unsent", jint(t->unsent));
        jset(o, "max_lag_ms", jms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
    }
}

/* "outcomes": {name: count} of every outcome seen. */
static json_t *jsonOutcomes(const struct totals *t)
{
    json_t *oc = jnew(json_object());
    for (size_t i = 0; i < OUTC_N; i++) {
        if (t->outcomes[i]) {
            jset(oc, outcomeLabel(i), jint(t->outcomes[i]));
        }
    }
    return oc;
}

/* "histogram": every non-empty bucket as [lo_us, hi_us, count]. */
static json_t *jsonHistogram(const struct hist *h)
{
    json_t *hb = jnew(json_array());
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        if (h->counts[i] == 0) {
            continue;
        }
        uint64_t lo, hi;
        hist_bounds(i, &lo, &hi);
        json_t *row = jnew(json_array());
        jappend(row, jint(lo));
        jappend(row, jint(hi));
        jappend(row, jint(h->counts[i]));
        jappend(hb, row);
    }
    return hb;
}

/* "timeline": one object per --timeline interval. */
static json_t *jsonTimeline(const struct bench *b)
{
    json_t *tl = jnew(json_array());
    for (size_t i = 0; i < b->n_timeline; i++) {
        const struct tl_row *r = &b->timeline[i];
        json_t *row = jnew(json_object());
        jset(row, "end_ms", jint(r->end_ms));
        jset(row, "ops", jint(r->ops));
        jset(row, "p50_ms", jms(r->p50_us));
        jset(row, "p99_ms", jms(r->p99_us));
        jset(row, "max_ms", jms(r->max_us));
        if (b->probe != NULL) {
            jset(row, "held_max_ms", jms(r->held_max_us));
        }
        jappend(tl, row);
    }
    return tl;
}

/* "stall_probe": the probe's totals. */
static json_t *jsonStallProbe(const struct stallprobe_stats *ps)
{
    json_t *sp = jnew(json_object());
    jset(sp, "cpus", jint(ps->cpus));
    jset(sp, "scheduling", json_string(ps->fifo ? "fifo" : "normal"));
    jset(sp, "period_ms", json_real(STALLPROBE_PERIOD_US / 1000.0));
    jset(sp, "seconds", json_real(round3(ps->seconds)));
    jset(sp, "wakeups", jint(ps->wakeups));
    jset(sp, "holds", jint(ps->holds));
    jset(sp, "held_ms_per_cpu", json_real(round3(bench_ms(ps->held_us) / ps->cpus)));
    jset(sp, "held_max_ms", jms(ps->held_max_us));
    return sp;
}

static void printJson(struct bench *b, const struct totals *t)
{
    json_t *o = jnew(json_object());
    jsonRun(o, b, t);
    jsonFigures(o, b, t);
    jset(o, "outcomes", jsonOutcomes(t));
    jset(o, "histogram", jsonHistogram(t->lat));
    if (b->cfg.timeline_ms != 0) {
        json_t *tl = jsonTimeline(b);
        jset(o, "timeline_ms", jint(b->cfg.timeline_ms));
        jset(o, "timeline", tl);
    }
    if (b->probe != NULL) {
        jset(o, "stall_probe", jsonStallProbe(&b->probe_stats));
    }
    jset(o, "run_id", json_string(b->run_id));
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12) | JSON_COMPACT);
    if (s == NULL) {
        jsonOutOfMemory();
    }
    puts(s);
    free(s);
    json_decref(o);
}

/* ---- text ---------------------------------------------------------------------------- */

/* The "workload" and "mode" lines. */
static void textRun(const struct bench *b, const struct totals *t)
{
    printf("workload     %s", bench_workload_names[b->cfg.workload]);
    if (bench_uses_key_set(&b->cfg)) {
        printf(" (%u keys)", b->cfg.keys);
    }
    printf("\n");
    const char *s = b->cfg.connections == 1 ? "" : "s";
    if (b->cfg.rate) {
        printf("mode         open loop, target %" PRIu64 " ops/s, at most %u in flight, "
               "%u connection%s\n",
               b->cfg.rate, t->threads, b->cfg.connections, s);
    } else if (b->cfg.threads) {
        printf("mode         closed loop, %u threads with a synchronous client each\n",
               t->threads);
    } else {
        printf("mode         closed loop, %u in flight, %u connection%s\n", t->threads,
               b->cfg.connections, s);
    }
}

/* The counts, the outcomes and the latency figures; with --rate the service time, unsent
 * and lag too. */
static void textFigures(struct bench *b, const struct totals *t)
{
    const struct hist *h = t->lat;
    double ops_s = t->elapsed_s > 0 ? (double)t->ops / t->elapsed_s : 0;
    printf("duration     %.2f s\n", t->elapsed_s);
    printf("ops          %" PRIu64 "\n", t->ops);
    printf("ops/s        %.1f\n", ops_s);
    printf("errors       %" PRIu64 " (no answer: %" PRIu64 ")\n", t->errors, t->transport);
    printf("outcomes    ");
    for (size_t i = 0; i < OUTC_N; i++) {
        if (t->outcomes[i]) {
            printf(" %s %" PRIu64, outcomeLabel(i), t->outcomes[i]);
        }
    }
    printf("\n");
    printf("latency ms   p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  mean %.3f%s\n",
           bench_ms(hist_percentile(h, 50)), bench_ms(hist_percentile(h, 90)),
           bench_ms(hist_percentile(h, 99)), bench_ms(hist_percentile(h, 99.9)),
           bench_ms(h->total ? h->max : 0), hist_mean(h) / 1000.0,
           b->cfg.rate ? "  (from the scheduled send time)" : "");
    if (b->cfg.rate) {
        printf("service ms   p50 %.3f  p99 %.3f  (send to answer)\n",
               bench_ms(hist_percentile(t->svc, 50)), bench_ms(hist_percentile(t->svc, 99)));
        printf("unsent       %" PRIu64 " (scheduled, but the run ended first; in the latency "
               "with their wait until then)\n",
               t->unsent);
        printf("max lag      %.3f ms behind schedule\n",
               bench_ms(atomic_load_explicit(&b->max_lag, memory_order_relaxed)));
    }
}

/* The --timeline table. */
static void textTimeline(const struct bench *b)
{
    printf("timeline (every %u ms, by the time operations ended):\n", b->cfg.timeline_ms);
    printf("  %10s %9s %9s %9s %9s%s\n", "until ms", "ops", "p50 ms", "p99 ms", "max ms",
           b->probe != NULL ? "   held ms" : "");
    for (size_t i = 0; i < b->n_timeline; i++) {
        const struct tl_row *r = &b->timeline[i];
        printf("  %10" PRIu64 " %9" PRIu64 " %9.3f %9.3f %9.3f", r->end_ms, r->ops,
               bench_ms(r->p50_us), bench_ms(r->p99_us), bench_ms(r->max_us));
        if (b->probe != NULL) {
            printf(" %9.3f", bench_ms(r->held_max_us));
        }
        printf("\n");
    }
}

static void printText(struct bench *b, const struct totals *t)
{
    textRun(b, t);
    textFigures(b, t);
    if (b->probe != NULL) {
        stallprobe_print(stdout, &b->probe_stats);
    }
    if (!b->cfg.no_histogram) {
        printf("distribution (latency ms, count, share, cumulative):\n");
        hist_print_ascii(stdout, t->lat, 1000.0, "ms", 50);
    }
    if (b->cfg.timeline_ms != 0) {
        textTimeline(b);
    }
}

void report_print(struct bench *b, const struct totals *t)
{
    if (b->cfg.json) {
        printJson(b, t);
    } else {
        printText(b, t);
    }
}
