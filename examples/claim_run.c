/* claim_run: charge a customer at most once per idempotency key, with libidem.
 *
 *   claim_run KEY AMOUNT        (IDEM_CLUSTER and IDEM_TOKEN from the environment,
 *                                as tools/quickstart.sh writes them to .idem/env; with
 *                                its --tls also IDEM_TLS_CA, IDEM_TLS_CERT, IDEM_TLS_KEY:
 *                                the RPC is then TLS with a client certificate)
 *
 * Run it twice with the same key and amount: the first run charges and prints the
 * receipt; the second prints the same receipt, replayed, without charging again. A
 * different amount with the same key is refused (mismatch). Exit status: 0 charged or
 * replayed, 1 any other outcome, 2 usage or setup, 3 nothing ran (retry later with the same
 * key), 4 charged but not recorded (do not charge again). Build it against an installed
 * libidem with:
 *
 *   cc claim_run.c $(pkg-config --cflags --libs idem) -o claim_run */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <idem.h>

/* An environment variable, NULL when unset or empty. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* What the business function needs, and where it leaves its answer: the response it
 * returns points into this struct, which outlives idem_run(). */
struct charge {
    const char *amount;
    char receipt[128];
};

/* The business function: "charges" the card and classifies the result. A real one would
 * call the payment provider with the fencing token as its own idempotency key. */
static int chargeCard(void *arg, uint64_t token, struct idem_response *response)
{
    struct charge *ch = arg;
    int n = snprintf(ch->receipt, sizeof ch->receipt,
                     "{\"charged\": \"%s\", \"fence\": %llu}", ch->amount,
                     (unsigned long long)token);
    fprintf(stderr, "claim_run: charging %s (fencing token %llu)\n", ch->amount,
            (unsigned long long)token);
    response->status = 201;
    response->body = (const uint8_t *)ch->receipt;
    response->body_len = (size_t)n;
    return IDEM_RUN_SUCCEEDED; /* IDEM_RUN_RETRYABLE if nothing happened (e.g. declined
                                  before any side effect), IDEM_RUN_UNKNOWN on a timeout */
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: claim_run KEY AMOUNT\n");
        return 2;
    }
    const char *key = argv[1];
    struct charge ch = {.amount = argv[2]};

    struct idem_options opts = {
        .seeds = getenv("IDEM_CLUSTER"), /* "127.0.0.1:7001,127.0.0.1:7002,..." */
        .token = getenv("IDEM_TOKEN"),
        .default_deadline_ms = 5000,
        /* Any of them set turns TLS on (idem.h): the node verified against the CA, the
         * client certificate presented (the RPC asks for one when the nodes have a CA). */
        .tls_ca_file = env("IDEM_TLS_CA"),
        .tls_cert_file = env("IDEM_TLS_CERT"),
        .tls_key_file = env("IDEM_TLS_KEY"),
    };
    char why[256];
    struct idem_client *client = NULL;
    int rv = idem_client_open(&opts, &client, why, sizeof why);
    if (rv != IDEM_OK) {
        fprintf(stderr, "claim_run: %s: %s\n", idem_strerror(rv), why);
        return 2;
    }

    /* The fingerprint says what the request is: the same key with another amount is a
     * mismatch, not a retry. */
    char request[256];
    snprintf(request, sizeof request, "POST /charges amount=%s", ch.amount);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    idem_fingerprint(request, strlen(request), fp);

    struct idem_claim_opts copts = {.lease_ms = 10000};
    struct idem_result res;
    rv = idem_run(client, key, fp, &copts, chargeCard, &ch, &res);
    /* An error after the charge ran (res.ran): its complete did not land (e.g. no leader
     * answered before the deadline), and the key stays in progress until the lease ends,
     * then answers lease_expired: running again would never replay the receipt. Store it
     * with the claim's token instead, a few times. (chargeCard only succeeds; a function
     * that also fails would complete with its class's completion, or release.) */
    for (int i = 0; i < 3 && rv != IDEM_OK && rv != IDEM_EINVAL && res.ran && res.has_response;
         i++) {
        fprintf(stderr, "claim_run: the charge ran but was not recorded (%s: %s); retrying\n",
                idem_strerror(rv), res.detail);
        struct idem_result done;
        rv = idem_complete(client, key, res.token, IDEM_COMPLETION_SUCCEEDED, &res.response, 0,
                           &done);
        res.finish_outcome = done.outcome;
        snprintf(res.detail, sizeof res.detail, "%s", done.detail);
        idem_result_free(&done);
    }
    int code = 0;
    if (rv != IDEM_OK && res.ran) {
        /* Still not recorded. Do not charge again: complete with this token later, or have
         * an operator resolve the key. */
        fprintf(stderr, "claim_run: %s: %s; the charge ran (fencing token %llu), not recorded\n",
                idem_strerror(rv), res.detail, (unsigned long long)res.token);
        code = 4;
    } else if (rv == IDEM_EINVAL || rv == IDEM_ETOOBIG) {
        /* Before the charge ran, refused as it stands (e.g. an empty key): the same call
         * will never succeed. */
        fprintf(stderr, "claim_run: %s: %s\n", idem_strerror(rv), res.detail);
        code = 2;
    } else if (rv != IDEM_OK) {
        /* Before the charge ran (e.g. unavailable): nothing ran here, and retrying with the
         * same key is safe (it never charges twice; a charge that was recorded replays). */
        fprintf(stderr, "claim_run: %s: %s\n", idem_strerror(rv), res.detail);
        code = 3;
    } else {
        printf("outcome: %s\n", idem_outcome_name(res.outcome));
        printf("ran: %s\n", res.ran ? "yes" : "no");
        if (res.has_response) {
            printf("status: %u\nbody: %.*s\n", res.response.status, (int)res.response.body_len,
                   (const char *)res.response.body);
        }
        if (res.ran) {
            printf("finish: %s\n", idem_outcome_name(res.finish_outcome));
        }
        if (res.outcome == IDEM_OUTCOME_IN_PROGRESS) {
            printf("retry_after_ms: %llu\n", (unsigned long long)res.retry_after_ms);
        }
        if (res.ran && res.finish_outcome != IDEM_OUTCOME_OK) {
            /* lease_lost: another attempt took the key over while the charge ran; this
             * receipt was not stored. */
            fprintf(stderr, "claim_run: the charge ran but its receipt was not stored: "
                            "complete answered %s\n",
                    idem_outcome_name(res.finish_outcome));
            code = 1;
        } else if (res.outcome != IDEM_OUTCOME_ACQUIRED && res.outcome != IDEM_OUTCOME_REPLAY) {
            code = 1;
        }
    }
    idem_result_free(&res);
    idem_client_close(client);
    return code;
}
