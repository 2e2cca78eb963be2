/* claim_run: charge a customer at most once per idempotency key, with libidem.
 *
 *   claim_run KEY AMOUNT        (IDEM_CLUSTER and IDEM_TOKEN from the environment,
 *                                as tools/quickstart.sh writes them to .idem/env)
 *
 * Run it twice with the same key and amount: the first run charges and prints the
 * receipt; the second prints the same receipt, replayed, without charging again. A
 * different amount with the same key is refused (mismatch). Build it against an installed
 * libidem with:
 *
 *   cc claim_run.c $(pkg-config --cflags --libs idem) -o claim_run */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <idem.h>

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
    int code = 0;
    if (rv != IDEM_OK) {
        /* Unavailable: nothing is known to have happened; retrying with the same key is
         * safe (a charge that did run replays). */
        fprintf(stderr, "claim_run: %s: %s\n", idem_strerror(rv), res.detail);
        code = 3;
    } else {
        printf("outcome: %s\n", idem_outcome_name(res.outcome));
        printf("ran: %s\n", res.ran ? "yes" : "no");
        if (res.has_response) {
            printf("status: %u\nbody: %.*s\n", res.response.status, (int)res.response.body_len,
                   (const char *)res.response.body);
        }
        if (res.outcome == IDEM_OUTCOME_IN_PROGRESS) {
            printf("retry_after_ms: %llu\n", (unsigned long long)res.retry_after_ms);
        }
        if (res.outcome != IDEM_OUTCOME_ACQUIRED && res.outcome != IDEM_OUTCOME_REPLAY) {
            code = 1;
        }
    }
    idem_result_free(&res);
    idem_client_close(client);
    return code;
}
