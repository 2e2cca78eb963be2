#!/usr/bin/env python3
"""run_charge: charge a customer at most once per idempotency key, with idem.Client.run.

    python3 examples/python/run_charge.py --idem http://127.0.0.1:8001 --token "$IDEM_TOKEN" \\
        order-7 "10 EUR"

Run it twice with the same key and amount: the first run charges (stderr says so) and
prints the receipt; the second prints the same receipt, replayed, without charging again.
The same key with another amount is refused (mismatch). Exit status: 0 charged or
replayed, 1 another outcome, 2 usage, 3 nothing ran (retry later with the same key),
4 charged but not recorded (do not charge again). Python 3.11+, standard library only: the
package `idem` is found in client/python when it is not installed.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "..", "client", "python"))
import idem  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--idem", default=os.environ.get("IDEM_HTTP"),
                   help="the nodes' gateway URLs, comma-separated (default: $IDEM_HTTP, else "
                        "the quickstart cluster's 127.0.0.1:8001-8003, https:// when "
                        "$IDEM_TLS_CA is set)")
    p.add_argument("--token", default=os.environ.get("IDEM_TOKEN"),
                   help="the tenant's bearer token (default: $IDEM_TOKEN)")
    p.add_argument("--cafile", default=os.environ.get("IDEM_TLS_CA"), help="CA for https://")
    p.add_argument("--certfile", default=os.environ.get("IDEM_TLS_CERT"),
                   help="client certificate for https:// (default: $IDEM_TLS_CERT)")
    p.add_argument("--keyfile", default=os.environ.get("IDEM_TLS_KEY"),
                   help="its key (default: $IDEM_TLS_KEY)")
    p.add_argument("key")
    p.add_argument("amount")
    a = p.parse_args()
    if not a.token:
        p.error("no token: --token or IDEM_TOKEN")
    if bool(a.certfile) != bool(a.keyfile):
        p.error("a client certificate needs its key: --certfile and --keyfile together")
    if not a.idem:
        scheme = "https" if a.cafile else "http"
        a.idem = ",".join("%s://127.0.0.1:%d" % (scheme, 8000 + i) for i in (1, 2, 3))
    client = idem.Client(a.idem, a.token, cafile=a.cafile, certfile=a.certfile or None,
                         keyfile=a.keyfile or None)

    def charge(token):
        # A real one would call the payment provider with the fencing token (or the key) as
        # its own idempotency key, and classify what happened:
        #   raise idem.Retryable(...)   declined before any side effect: the next try runs
        #   raise idem.Ambiguous(...)   a timeout after sending: quarantined until resolved
        print("run_charge: charging %s (fencing token %d)" % (a.amount, token), file=sys.stderr)
        receipt = {"charged": a.amount, "fence": token}
        return idem.Response(201, {"content-type": "application/json"}, json.dumps(receipt))

    try:
        res = client.run(a.key, charge, request={"method": "POST", "path": "/charges",
                                                 "body": {"amount": a.amount}})
    except idem.NotRecorded as e:
        print("charged, but not recorded (%s): do not charge again" % e.cause, file=sys.stderr)
        return 4
    except (idem.Unavailable, idem.InProgressTimeout) as e:
        print("nothing ran (%s): retry later with the same key" % e, file=sys.stderr)
        return 3
    except idem.InvalidRequest as e:
        print("refused as it stands: %s" % e, file=sys.stderr)
        return 2
    except idem.IdemError as e:
        print("outcome: %s (%s)" % (e.code, type(e).__name__))
        return 1
    finally:
        client.close()
    print("outcome: %s, receipt: %s" % ("replay" if res.replayed else "charged",
                                         res.response.text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
