"""Lease renewal while a holder works: the rule of proto/renew_plan.h (the one libidem's
idem_run and the proxy follow), and the background thread Client.run and the middlewares
start for it."""
import threading
import time

from .errors import LeaseLost, NotFound

RENEW_MIN_INTERVAL_MS = 20
RENEW_ATTEMPT_MAX_MS = 2000
RENEW_MIN_DEADLINE_MS = 100
LEASE_GUESS_MS = 1000  # when the lease can be neither asked for nor estimated


def now_ms():
    return int(time.monotonic() * 1000)


def renew_plan(now, lease_ms, lease_end, last_ok, failed, first):
    """(at, deadline_ms): when to send the next renewal and how long to give it, as
    proto/renew_plan.h says (all times ms of one monotonic clock): a third of the lease after
    the last success (at least 20 ms); an eighth of that after a failure; at once when the
    claim's lease has less than 20 ms left; the deadline is the lease left then less that
    eighth (all of it when less), at most a third of the lease and 2 s, at least 100 ms."""
    interval = max(lease_ms // 3, RENEW_MIN_INTERVAL_MS)
    retry = max(interval // 8, RENEW_MIN_INTERVAL_MS)
    when = now + retry if failed else last_ok + interval
    if first and not failed and (lease_end <= now or lease_end - now < RENEW_MIN_INTERVAL_MS):
        when = now
    at = max(when, now)
    left = lease_end - at if lease_end > at else 0
    dl = left - retry if left > retry else left
    dl = min(dl, interval, RENEW_ATTEMPT_MAX_MS)
    dl = max(dl, RENEW_MIN_DEADLINE_MS)
    return at, dl


class Renewer:
    """Renews (key, token) on a thread of its own until stop(): the schedule is renew_plan's,
    on the lease the claim was granted (lease_est_ms: asked for, or estimated), then on the
    lease each renewal granted. lost: a renewal answered lease_lost or not_found (no more are
    sent); lapsed: the lease ended with no renewal answered in time; renewals: how many
    answered ok; last_error: the last failed renewal's error."""

    def __init__(self, client, key, token, lease_ms, lease_est_ms, sent_ms):
        self.client = client
        self.key = key
        self.token = token
        self.lease_ms = lease_ms  # sent with each renewal; None: the tenant's default
        self.lease_est_ms = lease_est_ms
        self.lease_end = sent_ms + lease_est_ms
        self.last_ok = sent_ms
        self.lost = False
        self.lapsed = False
        self.renewals = 0
        self.last_error = None
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._main, name="idem-renew", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        """Stops the thread and waits for it (and a renewal in flight: at most 2 s)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        if not self.lost and now_ms() > self.lease_end:
            self.lapsed = True

    def note(self):
        """What the renewals saw, "" when nothing went wrong."""
        if self.lost:
            return "lease lost while the function ran (a renewal answered lease_lost)"
        if self.lapsed:
            return ("lease may have lapsed while the function ran: no renewal answered in "
                    "time (last renewal error: %s)" % (self.last_error or "none"))
        return ""

    def _main(self):
        failed = False
        with self._cond:
            while not self._stop and not self.lost:
                at, dl = renew_plan(now_ms(), self.lease_est_ms, self.lease_end, self.last_ok,
                                    failed, self.renewals == 0)
                while not self._stop:
                    wait = (at - now_ms()) / 1000.0
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stop:
                    break
                self._cond.release()
                sent = now_ms()
                err, granted = None, None
                try:
                    granted = self.client.renew(self.key, self.token, lease_ms=self.lease_ms,
                                                deadline=dl / 1000.0)
                except Exception as e:  # IdemError, or a bug: never let the thread die
                    err = e
                back = now_ms()
                self._cond.acquire()
                failed = granted is None and not isinstance(err, (LeaseLost, NotFound))
                if granted is not None:
                    self.renewals += 1
                    if back > self.lease_end:
                        self.lapsed = True  # renewed, but after the lease had ended
                    self.lease_est_ms = granted.lease_ms
                    # The lease runs from when the node applied the renewal, after it was
                    # sent: counting from the send is on the safe side.
                    self.last_ok = sent
                    self.lease_end = sent + self.lease_est_ms
                elif isinstance(err, (LeaseLost, NotFound)):
                    self.lost = True
                else:
                    self.last_error = err
