/* fuzz_client_response: what libidem (client/) makes of the bytes a node sends back: the
 * frames (proto/frame.h), each answer's decoding and matching (IdemResponseDecode, which the
 * synchronous client's round trip and the asynchronous client's connections, hence the
 * gateway's forwarder, share), the answer's classification (idem_response_outcome,
 * IdemFrameTooLarge) and the typed result the calls return (IdemResultFill: the result, its
 * stored response, a record and the stored response packed inside it).
 *
 * Input: the first byte is the request id awaited (0: none in particular, as the
 * asynchronous client, which matches ids itself); the rest is the stream of frames, read as
 * the asynchronous client reads its buffer: whole frames one after another, until a partial
 * one or a prefix over IDEM_MAX_FRAME.
 *
 * Invariants (abort() on violation):
 * - frame_check() never declares a body that is not in the bytes it calls complete;
 *   IdemFrameTooLargeWhy() says something, NUL-terminated, naming the node;
 * - IdemResponseDecode() refuses exactly what protobuf-c cannot decode, saying so with the
 *   length and the node only (never the frame's bytes); else it gives the Response for
 *   request id 0 (refused) and for the id awaited (or any id, awaiting none), and drops
 *   the others, with *out NULL;
 * - idem_response_outcome() is the result's outcome (unspecified without a result);
 *   IdemFrameTooLarge() is outcome invalid with detail "frame_too_large";
 * - IdemResultFill() returns IDEM_OK or IDEM_EPROTO (no result, or a record's stored response
 *   that does not decode: the library's detail, nothing owned); IDEM_OK copies the result's
 *   fields, and every pointer of the response it gives (headers, body, body_ref, body_sha256)
 *   is readable for its length (ASan); the detail is NUL-terminated;
 * - idem_result_free() frees everything (LeakSanitizer) and zeroes the result. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ADDR "node-a:7001"

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_client_response: invariant violated: %s\n", what);
    abort();
}

static volatile uint8_t sink; /* reads that must not be optimised away */

static void touch(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) {
        x ^= b[i];
    }
    sink = x;
}

static void isZero(const struct idem_result *r)
{
    const uint8_t *b = (const uint8_t *)r;
    for (size_t i = 0; i < sizeof *r; i++) {
        if (b[i] != 0) {
            fail("idem_result_free did not zero the result");
        }
    }
}

static void checkResponse(const struct idem_response *r)
{
    if ((r->n_headers > 0) != (r->headers != NULL)) {
        fail("a response's header count and array disagree");
    }
    for (size_t i = 0; i < r->n_headers; i++) {
        if (r->headers[i].name == NULL || (r->headers[i].value_len > 0 && !r->headers[i].value)) {
            fail("a response header without a name or value");
        }
        touch(r->headers[i].name, strlen(r->headers[i].name));
        touch(r->headers[i].value, r->headers[i].value_len);
    }
    if ((r->body_len > 0) != (r->body != NULL)) {
        fail("a response's body length and pointer disagree");
    }
    touch(r->body, r->body_len);
    if (r->body_ref != NULL) {
        touch(r->body_ref, strlen(r->body_ref));
    }
    if (r->body_sha256 != NULL) {
        touch(r->body_sha256, 32);
    }
}

/* Fills a result from m (taken), as both clients do with a leader's answer, and checks it. */
static void fill(Idem__Response *m)
{
    const Idem__Result *res = m->result;
    Idem__Result want = IDEM__RESULT__INIT;
    if (res != NULL) {
        want = *res;
    }
    bool had = res != NULL;
    struct idem_result out;
    memset(&out, 0x5a, sizeof out);
    int rv = IdemResultFill(&out, m); /* m is out's (or freed) from here */
    if (memchr(out.detail, '\0', sizeof out.detail) == NULL) {
        fail("a result's detail is not NUL-terminated");
    }
    if (rv == IDEM_EPROTO) {
        if (out.priv_ != NULL || out.detail[0] == '\0' || out.has_response) {
            fail("a protocol error owns something, or says nothing");
        }
    } else if (rv != IDEM_OK) {
        fail("IdemResultFill returned neither IDEM_OK nor IDEM_EPROTO");
    } else {
        if (!had) {
            fail("an answer without a result was filled");
        }
        if (out.outcome != (int)want.outcome || out.token != want.token ||
            out.lease_deadline_ms != want.lease_deadline_ms ||
            out.retry_after_ms != want.retry_after_ms || out.expires_at_ms != want.expires_at_ms ||
            out.previous_token != want.previous_token || out.takeover != (want.takeover ? 1 : 0)) {
            fail("a result's fields are not the answer's");
        }
        if (out.has_response) {
            checkResponse(&out.response);
        } else if (want.response != NULL) {
            fail("a result with a stored response has none");
        }
        if (out.has_record != (want.record != NULL)) {
            fail("a result's record is not the answer's");
        }
    }
    idem_result_free(&out);
    isZero(&out);
}

/* One frame's body, as the clients take it. */
static void answer(const uint8_t *body, uint32_t len, uint64_t expect)
{
    /* A private copy: ASan sees any read past the frame. */
    uint8_t *p = malloc(len ? len : 1);
    if (p == NULL) {
        abort();
    }
    memcpy(p, body, len);
    Idem__Response *ref = idem__response__unpack(NULL, len, p);
    char why[IDEM_ERRMSG_LEN];
    memset(why, 'x', sizeof why);
    why[sizeof why - 1] = '\0';
    Idem__Response *m = (Idem__Response *)1;
    enum idem_answer an = IdemResponseDecode(p, len, expect, ADDR, &m, why, sizeof why);
    free(p);
    if (ref == NULL) {
        char said[128];
        snprintf(said, sizeof said, ADDR ": a %u-byte response does not decode", len);
        if (an != IDEM_ANSWER_BAD || m != NULL || strcmp(why, said) != 0) {
            fail("an answer protobuf-c cannot decode was not refused, and said so");
        }
        return;
    }
    enum idem_answer want = ref->request_id == 0                       ? IDEM_ANSWER_REFUSED
                            : expect != 0 && ref->request_id != expect ? IDEM_ANSWER_OTHER
                                                                       : IDEM_ANSWER_MINE;
    idem__response__free_unpacked(ref, NULL);
    if (an != want) {
        fail("an answer was not matched by its request id");
    }
    if ((m == NULL) != (an == IDEM_ANSWER_OTHER) || why[0] != 'x') {
        fail("an answer's Response is missing, or one dropped is given, or why was written");
    }
    if (m == NULL) {
        return;
    }
    Idem__Outcome oc = m->result != NULL ? m->result->outcome : IDEM__OUTCOME__OUTCOME_UNSPECIFIED;
    if (idem_response_outcome(m) != oc) {
        fail("idem_response_outcome is not the result's outcome");
    }
    bool tooLarge = oc == IDEM__OUTCOME__OUTCOME_INVALID && m->result->detail != NULL &&
                    strcmp(m->result->detail, IDEM_FRAME_TOO_LARGE) == 0;
    if (IdemFrameTooLarge(m) != tooLarge) {
        fail("IdemFrameTooLarge disagrees with the answer");
    }
    fill(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    uint64_t expect = data[0];
    const uint8_t *p = data + 1;
    size_t have = size - 1;
    for (;;) {
        uint32_t len = 0;
        enum frame_status fs = frame_check(p, have, IDEM_MAX_FRAME, &len);
        if (fs == FRAME_SHORT || fs == FRAME_PARTIAL) {
            if (fs == FRAME_PARTIAL && have - FRAME_HEADER_LEN >= len) {
                fail("a whole frame was called partial");
            }
            return 0;
        }
        if (fs == FRAME_TOO_LARGE) {
            char why[IDEM_ERRMSG_LEN];
            IdemFrameTooLargeWhy(why, sizeof why, ADDR, p, len);
            if (len <= IDEM_MAX_FRAME || memchr(why, '\0', sizeof why) == NULL ||
                strstr(why, ADDR) == NULL) {
                fail("a frame too large was not refused, and said so");
            }
            return 0;
        }
        if (have - FRAME_HEADER_LEN < len) {
            fail("a frame called complete is not all there");
        }
        answer(p + FRAME_HEADER_LEN, len, expect);
        p += FRAME_HEADER_LEN + (size_t)len;
        have -= FRAME_HEADER_LEN + (size_t)len;
    }
}
