"""Integration tests of idemctl, the admin CLI (issue #5 item 2): status with its warnings,
membership and transfer seen through status, key get/resolve/purge, quarantine list, the
admin token, --help on every command, usage errors, the bench alias and the environment.
Real idemd processes on loopback (harness.py), except for transfer after a "did not move"
answer, which runs against fake RPC nodes (FakeCluster). Every --json output is parsed.
Run: python3 -m unittest -v tests/integration/test_idemctl.py
"""
import hashlib
import hmac
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import shutil
import signal
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (ClusterTestCase, IDEMCTL, IDEMD, Cluster, Node, fp,  # noqa: E402
                     free_port, http_request, recv_exact, wait_for)
from test_cluster import _field, _fields, _frame, _read_frame, _uvarint  # noqa: E402

ACQ = "acquired"


def key_digest(tenant, key, secret=None):
    """docs/contract.md: the first 12 hex of HMAC-SHA256 over the framed tenant and key (4-byte
    big-endian length, then the bytes, for each) under HMAC-SHA256(secret, "idemd key_digest
    v1"), secret being the members' raft.secret_file (what a file holds, trailing whitespace
    cut); without one, of SHA-256 over them; as server/fingerprint.c computes it."""
    framed = b"".join(struct.pack(">I", len(p)) + p for p in (tenant.encode(), key.encode()))
    if secret is None:
        return hashlib.sha256(framed).hexdigest()[:12]
    k = hmac.new(secret.encode(), b"idemd key_digest v1", hashlib.sha256).digest()
    return hmac.new(k, framed, hashlib.sha256).hexdigest()[:12]


def run_ctl(args, env=None, timeout=60):
    """idemctl with exactly these arguments (no flags added); returns (rc, stdout, stderr)."""
    e = dict(os.environ)
    for k in ("IDEM_CLUSTER", "IDEM_TOKEN", "IDEM_ADMIN_TOKEN"):
        e.pop(k, None)
    if env:
        e.update(env)
    p = subprocess.run([IDEMCTL] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=e, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def sha256_hex(text):
    return hashlib.sha256(text.encode()).hexdigest()


def run_with_tty_stderr(args, timeout=60):
    """idemctl with stderr on a pseudo-terminal (idem-bench prints its progress line only
    to a terminal); returns (rc, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    e = dict(os.environ)
    for k in ("IDEM_CLUSTER", "IDEM_TOKEN", "IDEM_ADMIN_TOKEN"):
        e.pop(k, None)
    p = subprocess.Popen([IDEMCTL] + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=slave, stdin=subprocess.DEVNULL, env=e)
    os.close(slave)
    got = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                break
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every holder of the terminal's other side is gone
                break
            if not data:
                break
            got += data
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return p.returncode, out.decode(errors="replace"), got.decode(errors="replace")


class CtlTest(ClusterTestCase):
    cluster_opts = {}

    leader_timeout = 30

    # helpers ---------------------------------------------------------------------------

    def ok(self, *args, **kw):
        """idemctl --json ...; asserts exit 0 and returns the parsed answer."""
        rc, out = self.c.ctl(*args, **kw)
        self.assertEqual(rc, 0, (args, out))
        self.assertIsNotNone(out, args)
        return out

    def human(self, *args, admin=None, ids=None, deadline=None):
        """idemctl without --json; returns (rc, stdout, stderr)."""
        a = ["--cluster", self.c.addrs(ids), "--token", self.c.token,
             "--admin-token", admin or self.c.admin]
        if deadline is not None:
            a += ["--deadline", deadline]
        return run_ctl(a + list(args))

    def restart_with_config(self, old, new):
        """Stops every node, replaces `old` (which each config must hold) by `new` in each
        node's config, starts them again and waits for a leader."""
        for nid in sorted(self.c.nodes):
            self.c.kill(nid)
        for node in self.c.nodes.values():
            with open(node.cfg) as f:
                cfg = f.read()
            self.assertIn(old, cfg)
            with open(node.cfg, "w") as f:
                f.write(cfg.replace(old, new))
        for nid in sorted(self.c.nodes):
            self.c.start(nid)
        self.c.wait_leader(timeout=30)

    def claim(self, key, n=1, ttl=None):
        extra = ["--ttl", ttl] if ttl is not None else []
        return self.ok("claim", key, "--fingerprint", fp(n), *extra)

    def status(self, *extra, ids=None):
        return self.ok("status", *extra, ids=ids)


class TestIdemctlStatus(CtlTest):
    def test_healthy_cluster(self):
        st = self.status()
        self.assertTrue(st["quorum"], st)
        self.assertEqual((st["voters"], st["reachable_voters"]), (3, 3))
        self.assertEqual(st["warnings"], [])
        self.assertEqual(len(st["nodes"]), 3)
        self.assertEqual(sorted(m["id"] for m in st["members"]), [1, 2, 3])
        self.assertEqual(sorted(n["role"] for n in st["nodes"]), ["follower", "follower", "leader"])
        for n in st["nodes"]:
            for field in ("id", "rpc_address", "role", "member_role", "term", "leader_id",
                          "commit_index", "applied_index", "lag", "last_snapshot_index",
                          "records", "tombstones", "quarantined", "bytes"):
                self.assertIn(field, n)
            self.assertEqual(n["leader_id"], st["leader_id"])
            self.assertEqual(n["member_role"], "voter")
        # Records, tombstones, quarantined and bytes count what the table holds.
        out = self.claim("status-q")
        self.ok("complete", "status-q", "--token", out["token"], "--status", 200,
                "--outcome", "unknown")
        self.c.wait_converged(3)
        for n in self.status()["nodes"]:
            self.assertEqual((n["records"], n["quarantined"], n["tombstones"]), (1, 1, 0), n)
            # key + fingerprint + the stored response (status 200: 3 packed bytes)
            self.assertEqual(n["bytes"], len("status-q") + 32 + 3)
        rc, text, err = self.human("status")
        self.assertEqual(rc, 0, err)
        self.assertIn("leader: %d" % st["leader_id"], text)
        self.assertIn("quorum: yes (3 of 3 voters reachable)", text)
        self.assertNotIn("warning", text)
        for header in ("ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "SNAPSHOT", "RECORDS",
                       "TOMBSTONES", "QUARANTINED", "BYTES"):
            self.assertIn(header, text)

    def test_one_node_killed(self):
        lid = self.c.leader()
        victim = [n for n in self.c.nodes if n != lid][0]
        self.c.kill(victim)
        # Only the survivors are listed: status finds the dead member through the others.
        st = self.status()
        self.assertTrue(st["quorum"], st)
        self.assertEqual((st["voters"], st["reachable_voters"]), (3, 2))
        dead = [n for n in st["nodes"] if n["id"] == victim]
        self.assertEqual(len(dead), 1, st)
        self.assertEqual(dead[0]["role"], "unreachable")
        self.assertEqual(len(st["warnings"]), 1, st["warnings"])
        self.assertIn("node %d" % victim, st["warnings"][0])
        self.assertIn("unreachable", st["warnings"][0])
        rc, text, err = self.human("status")
        self.assertEqual(rc, 0, err)
        warnings = [l for l in text.splitlines() if l.startswith("warning:")]
        self.assertEqual(len(warnings), 1, text)
        self.assertIn("node %d" % victim, warnings[0])
        # Still serving.
        self.assertEqual(self.claim("after-one-kill")["outcome"], ACQ)

    def test_two_killed_no_quorum(self):
        self.claim("before-outage")
        for nid in sorted(self.c.nodes)[1:]:
            self.c.kill(nid)
        st = self.status()
        self.assertFalse(st["quorum"], st)
        self.assertEqual((st["voters"], st["reachable_voters"]), (3, 1))
        self.assertTrue(any(w.startswith("no quorum: 1 of 3 voters") for w in st["warnings"]),
                        st["warnings"])
        rc, text, err = self.human("status")
        self.assertEqual(rc, 0, err)
        self.assertIn("quorum: NO", text)
        self.assertIn("warning: no quorum", text)
        # Once the survivor's election timeout passed, it follows nobody: no leader either.
        wait_for(lambda: self.status()["leader_id"] is None, 15, "no leader")
        self.assertTrue(any(w.startswith("no leader") for w in self.status()["warnings"]))
        # Fail closed: every data and key command is unavailable (exit 3), never answered.
        for args in (["claim", "x", "--fingerprint", fp(1)], ["get", "before-outage"],
                     ["key", "get", "alpha", "before-outage"],
                     ["key", "purge", "alpha", "before-outage"],
                     ["key", "resolve", "alpha", "before-outage", "--release"],
                     ["quarantine", "list"]):
            rc, out = self.c.ctl(*args, deadline=1500)
            self.assertEqual(rc, 3, (args, out))
            self.assertEqual(out["outcome"], "unavailable", (args, out))
        # An unanswered claim may have been applied: its attempt id (made up or given) comes
        # with the failure, the only way to get that lease back (it was lost before).
        rc, out = self.c.ctl("claim", "x", "--fingerprint", fp(1), deadline=1500)
        self.assertEqual((rc, out["outcome"]), (3, "unavailable"), out)
        self.assertRegex(out["attempt_id"], "^[0-9a-f]{32}$")
        rc, out = self.c.ctl("claim", "x", "--fingerprint", fp(1), "--attempt", "mine-1",
                             deadline=1500)
        self.assertEqual((rc, out["attempt_id"]), (3, "mine-1"), out)
        rc, text, err = self.human("claim", "x", "--fingerprint", fp(1), "--attempt", "mine-1",
                                   deadline=1500)
        self.assertEqual((rc, text), (3, ""), err)
        self.assertIn("send it again with --attempt mine-1 to get its lease back", err)

    def test_refused_token(self):
        # Refused by every node: a credential error (exit 4) that says so, not "no quorum".
        for token, outcome in (("not-a-token", "unauthenticated"), (self.c.token, "forbidden")):
            rc, text, err = self.human("status", admin=token)
            self.assertEqual((rc, text), (4, ""), err)
            self.assertIn("status: the admin token was refused by every node (%s)" % outcome,
                          err)
            rc, st = run_ctl_json(["--cluster", self.c.addrs(), "--admin-token", token,
                                   "status"])
            self.assertEqual(rc, 4, st)
            self.assertEqual(st["outcome"], outcome, st)
            self.assertIn("refused by every node", st["error"])
            self.assertNotIn("quorum", st)
            self.assertEqual({n["role"] for n in st["nodes"]}, {"refused"})
        # Refused by one node (its admin token differs): shown as refused, not unreachable,
        # and still a reachable voter.
        node = self.c.nodes[3]
        self.c.kill(3)
        with open(node.cfg) as f:
            cfg = f.read()
        self.assertIn(sha256_hex(self.c.admin), cfg)
        with open(node.cfg, "w") as f:
            f.write(cfg.replace(sha256_hex(self.c.admin), sha256_hex("another-admin-token")))
        self.c.start(3)

        def refused_by_3():
            st = self.status()
            row = [n for n in st["nodes"] if n["rpc_address"] == node.rpc]
            return st if row and row[0]["role"] == "refused" and st["leader_id"] else None
        st = wait_for(refused_by_3, 30, "node 3 to refuse the admin token")
        row = [n for n in st["nodes"] if n["rpc_address"] == node.rpc][0]
        self.assertEqual(row["id"], 3, row)
        self.assertIn("unauthenticated", row["error"])
        self.assertTrue(st["quorum"], st)
        self.assertEqual((st["voters"], st["reachable_voters"]), (3, 3), st)
        self.assertEqual(len(st["warnings"]), 1, st["warnings"])
        self.assertIn("node 3 ", st["warnings"][0])
        self.assertIn("refused", st["warnings"][0])
        self.assertNotIn("unreachable", st["warnings"][0])
        rc, text, err = self.human("status")
        self.assertEqual(rc, 0, err)
        self.assertIn("quorum: yes", text)
        self.assertNotIn("unreachable", text)
        # Even as the leader: the others follow it; it cannot be asked, but it leads.
        if st["leader_id"] != 3:
            self.assertEqual(self.ok("transfer", 3)["outcome"], "ok")
        st = wait_for(lambda: (lambda s: s if s["leader_id"] == 3 else None)(self.status()),
                      30, "node 3 to lead")
        self.assertTrue(st["quorum"], st)
        self.assertFalse([w for w in st["warnings"] if w.startswith("no ")], st["warnings"])

    def test_digest_in_human_output(self):
        st = self.c.wait_converged(3)
        rc, text, err = self.human("status", "--digest")
        self.assertEqual(rc, 0, err)
        lines = text.splitlines()
        self.assertIn("DIGEST", lines[1])
        for n in st["nodes"]:
            row = [l for l in lines if n["rpc_address"] in l]
            self.assertEqual(len(row), 1, text)
            self.assertIn(n["digest"], row[0])
        rc, text, err = self.human("status")
        self.assertNotIn("DIGEST", text)

    def test_duplicate_addresses_count_once(self):
        addrs = [self.c.nodes[i].rpc for i in sorted(self.c.nodes)]
        local = "localhost:" + addrs[0].rsplit(":", 1)[1]  # node 1 under another name
        for cluster in (addrs + [addrs[0]], addrs + [local], [local], [addrs[1], addrs[1]]):
            rc, st = run_ctl_json(["--cluster", ",".join(cluster), "--admin-token",
                                   self.c.admin, "status"])
            self.assertEqual(rc, 0, st)
            self.assertEqual(sorted(n["id"] for n in st["nodes"]), [1, 2, 3], (cluster, st))
            self.assertEqual(sorted(n["rpc_address"] for n in st["nodes"]), sorted(addrs))
            self.assertEqual((st["voters"], st["reachable_voters"]), (3, 3), st)
            self.assertEqual(st["warnings"], [], st)

    def test_down_node_under_another_spelling_counts_once(self):
        # The members' rpc_address is 127.0.0.1:P; --cluster says localhost:P. A node that
        # is down answers no node ID, so only its address can tell that it is the member
        # at 127.0.0.1:P: it is shown once, at its member address, with one warning. (A
        # follower: the leader's death would add a "no leader" warning.)
        victim = max(n for n in self.c.nodes if n != self.c.leader())
        self.c.kill(victim)
        ids = sorted(self.c.nodes)
        addrs = [self.c.nodes[i].rpc for i in ids]
        local = ["localhost:" + a.rsplit(":", 1)[1] for a in addrs]
        dead = self.c.nodes[victim].rpc
        for cluster in (local, [a if a != dead else "localhost:" + dead.rsplit(":", 1)[1]
                                for a in addrs]):
            rc, st = run_ctl_json(["--cluster", ",".join(cluster), "--admin-token",
                                   self.c.admin, "status"])
            self.assertEqual(rc, 0, st)
            self.assertEqual([(n["id"], n["rpc_address"]) for n in st["nodes"]],
                             list(zip(ids, addrs)), (cluster, st))
            self.assertEqual([n["role"] for n in st["nodes"] if n["id"] == victim],
                             ["unreachable"], st)
            self.assertEqual((st["voters"], st["reachable_voters"]), (3, 2), st)
            self.assertEqual(len(st["warnings"]), 1, st["warnings"])
            self.assertIn("node %d (%s) is unreachable" % (victim, dead), st["warnings"][0])
            rc, text, err = run_ctl(["--cluster", ",".join(cluster), "--admin-token",
                                     self.c.admin, "status"])
            self.assertEqual(rc, 0, err)
            port = ":" + dead.rsplit(":", 1)[1]
            rows = [l for l in text.splitlines() if port in l and not l.startswith("warning")]
            self.assertEqual(len(rows), 1, text)
            self.assertTrue(rows[0].startswith("%d " % victim), text)
            self.assertEqual(len([l for l in text.splitlines() if l.startswith("warning:")]), 1,
                             text)

    def test_human_output_escapes_control_characters(self):
        # A stored body with terminal escapes (a tenant's bytes) prints them visibly.
        key = "escape-1"
        out = self.claim(key, 7)
        self.ok("complete", key, "--token", out["token"], "--status", 200, "--body",
                "\x1b[2Jcleared\x07 \u009b1m back\\slash")
        rc, text, err = self.human("get", key)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("\x1b", text)
        self.assertNotIn("\x07", text)
        self.assertNotIn("\u009b", text)
        self.assertIn("\\x1b[2Jcleared\\x07 \\u009b1m back\\\\slash", text)

    def test_tokens_from_files(self):
        d = tempfile.mkdtemp(prefix="idemctl-tok-")
        try:
            adm = os.path.join(d, "admin")
            ten = os.path.join(d, "tenant")
            with open(adm, "w") as f:
                f.write(self.c.admin + "\n")
            with open(ten, "w") as f:
                f.write(self.c.token + "\r\nsecond line ignored\n")
            rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--admin-token-file", adm,
                                     "--json", "members", "list"])
            self.assertEqual(rc, 0, err)
            self.assertEqual(json.loads(text)["outcome"], "ok", text)
            self.assertEqual(err, "")  # no warning: the token is not on the command line
            rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--token-file", ten, "--json",
                                     "claim", "tokfile-1", "--fingerprint", "ab" * 32])
            self.assertEqual(rc, 0, err)
            self.assertEqual(json.loads(text)["outcome"], "acquired", text)
            self.assertEqual(err, "")
            # A file that is missing, empty or holds control bytes: usage errors (2), and
            # the token's bytes are never echoed.
            bad = os.path.join(d, "bad")
            with open(bad, "w") as f:
                f.write("tok\x1b[31men\n")
            for path, words in ((os.path.join(d, "none"), "No such file"), (bad, "printable")):
                rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--token-file", path,
                                         "--json", "claim", "tokfile-2", "--fingerprint",
                                         "ab" * 32])
                self.assertEqual(rc, 2, (path, err))
                self.assertIn(words, err)
                self.assertNotIn("\x1b", err)
            with open(bad, "w") as f:
                f.write("\n")
            rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--token-file", bad, "--json",
                                     "claim", "tokfile-3", "--fingerprint", "ab" * 32])
            self.assertEqual(rc, 2, err)
            self.assertIn("no token", err)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_members_list_says_who_answered(self):
        lid = self.c.leader()
        follower = [n for n in sorted(self.c.nodes) if n != lid][0]
        rpc = self.c.nodes[follower].rpc
        # A follower that knows the leader: its ID, address and the leader it follows.
        rc, text, err = run_ctl(["--cluster", rpc, "--admin-token", self.c.admin, "--json",
                                 "members", "list"])
        self.assertEqual(rc, 0, err)
        out = json.loads(text)
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(sorted(m["id"] for m in out["members"]), [1, 2, 3])  # as before
        self.assertEqual((out["node"], out["node_id"], out["leader_id"]), (rpc, follower, lid),
                         out)
        self.assertEqual(out["node_role"], "follower", out)
        # A token on the command line draws a warning (other users can read argv).
        self.assertIn("warning: a bearer token on the command line", err)
        self.assertIn("--admin-token-file", err)
        rc, text, err = run_ctl(["--cluster", rpc, "--admin-token", self.c.admin, "--token",
                                 "tenant-token-unused", "members"])
        self.assertEqual(rc, 0, err)
        # Both tokens on the command line are exposed, the one the command does not use too.
        self.assertIn("--admin-token-file", err)
        self.assertIn("--token-file", err)
        self.assertIn("node: %s\n" % rpc, text)
        self.assertIn("node_id: %d\n" % follower, text)
        self.assertIn("leader_id: %d\n" % lid, text)
        self.assertIn("RAFT_ADDRESS", text)
        # A lone node knows no leader: its configuration may be stale, and a note says so.
        for nid in [n for n in sorted(self.c.nodes) if n != follower]:
            self.c.kill(nid)
        def alone():
            row = [n for n in self.status(ids=[follower])["nodes"] if n["id"] == follower]
            return row and "leader_id" in row[0] and row[0]["leader_id"] is None
        wait_for(alone, 30, "node %d to follow nobody" % follower)
        for fmt in ("json", "human"):
            rc, text, err = run_ctl(["--cluster", rpc, "--admin-token", self.c.admin]
                                    + (["--json"] if fmt == "json" else []) + ["members"])
            self.assertEqual(rc, 0, err)
            self.assertIn("node %d (%s) knows no leader" % (follower, rpc), err)
            self.assertIn("may be stale", err)
            if fmt == "json":
                out = json.loads(text)
                self.assertEqual((out["node_id"], out["leader_id"]), (follower, None), out)
                self.assertEqual(len(out["members"]), 3, out)
            else:
                self.assertIn("leader_id: -\n", text)

    def test_wrong_listener_says_what_it_is(self):
        # An HTTP port: the first bytes read are "HTTP/1.1 ...", not a frame length.
        http = self.c.nodes[1].http
        for args in (["status"], ["members"], ["--json", "members"]):
            rc, text, err = run_ctl(["--cluster", http, "--admin-token", self.c.admin,
                                     "--deadline", "1000"] + args)
            self.assertEqual(rc, 3, (args, text, err))
            self.assertIn("answers HTTP, not the idemd binary RPC", text + err, args)
            self.assertNotIn("1213486160", text + err, args)
        # TLS against plaintext listeners: not a certificate problem.
        for args in (["status"], ["members"]):
            rc, text, err = run_ctl(["--tls", "--cluster", self.c.addrs(), "--admin-token",
                                     self.c.admin, "--deadline", "1000"] + args)
            self.assertEqual(rc, 3, (args, text, err))
            self.assertIn("wrong version number", text + err, args)
            self.assertIn("may not speak TLS (tls.rpc off)", err, args)
            self.assertNotIn("--tls-cert", err, args)


class TestIdemctlLag(CtlTest):
    # A slow heartbeat: followers learn the leader's commit index only with the next one, so
    # right after a claim they trail the leader's applied index by one entry.
    cluster_opts = dict(heartbeat_ms=1000, election_ms=5000)

    def test_lag_warning(self):
        lagging = None
        for i in range(10):
            self.claim("lag-%d" % i)
            st = self.status("--max-lag", "0")
            lagging = [w for w in st["warnings"] if " lags: " in w]
            if lagging:
                break
        self.assertTrue(lagging, "no follower seen behind the leader in 10 tries")
        self.assertIn("behind the leader's", lagging[0])
        # (a node that did not answer this status has no lag)
        behind = [n for n in st["nodes"] if n.get("lag")]
        self.assertTrue(behind, st)
        for n in behind:
            self.assertTrue(any("node %d " % n["id"] in w for w in lagging), (n, lagging))
        # The default threshold (1000 entries) tolerates one entry.
        self.assertEqual([w for w in self.status()["warnings"] if " lags: " in w], [])
        # Once the followers caught up, even --max-lag 0 is quiet.
        wait_for(lambda: not [w for w in self.status("--max-lag", "0")["warnings"]], 10,
                 "followers to catch up")

    def test_leaderless_cluster_keeps_its_quorum(self):
        # The leader is killed: until the survivors elect another one, there is no leader,
        # but two of three voters answer, so the cluster has its quorum (an election can
        # succeed); only "no leader" is warned about. (This class's election timeout is
        # 5 s, so the survivors go on following the dead leader meanwhile.)
        lid = self.c.leader()
        self.c.kill(lid)
        st = self.status()
        rc, text, err = self.human("status")
        self.assertEqual(rc, 0, err)
        self.assertIsNone(st["leader_id"], st)
        self.assertTrue(st["quorum"], st)
        self.assertEqual((st["voters"], st["reachable_voters"]), (3, 2), st)
        self.assertTrue(any(w.startswith("no leader") for w in st["warnings"]), st["warnings"])
        self.assertFalse(any(w.startswith("no quorum") for w in st["warnings"]),
                         st["warnings"])
        self.assertIn("leader: none   quorum: yes (2 of 3 voters reachable)", text)
        self.assertIn("warning: no leader", text)
        self.assertNotIn("no quorum", text)
        # A second voter down: no quorum.
        self.c.kill([n for n in sorted(self.c.nodes) if n != lid][0])
        st = self.status()
        self.assertFalse(st["quorum"], st)
        self.assertEqual((st["voters"], st["reachable_voters"]), (3, 1), st)
        self.assertTrue(any(w.startswith("no quorum: 1 of 3 voters") for w in st["warnings"]),
                        st["warnings"])


class TestIdemctlMembership(CtlTest):
    def test_add_fourth_then_remove(self):
        new = self.c.add_node(4)
        out = self.ok("members", "add", 4, new.raft, new.rpc, new.http)
        self.assertEqual(out["outcome"], "ok", out)
        # What it did and the next step.
        self.assertEqual(out["message"], "node 4 is a spare now; once it runs, `idemctl "
                         "members promote 4` makes it a voter", out)
        # A spare gets no log before its promotion: status shows it behind the leader, and
        # no lag warning for it (one that could never clear), even with --max-lag 0.
        def spare_row():
            st = self.status("--max-lag", "0", ids=[1, 2, 3])
            n4 = [n for n in st["nodes"] if n["id"] == 4 and n.get("lag") is not None]
            return (st, n4[0]) if n4 and n4[0]["member_role"] == "spare" else None
        st, n4 = wait_for(spare_row, 20, "node 4 in status as a spare")
        self.assertGreater(n4["lag"], 0, n4)
        self.assertEqual([w for w in st["warnings"] if "node 4" in w], [], st["warnings"])
        # Nor is it ready for traffic: the leader sends a spare nothing, so it has not even
        # the configuration that names it.
        st4, _, body = http_request(new.http, "GET", "/readyz", timeout=5)
        self.assertEqual((st4, body.get("reason")),
                         (503, "this node is not in its Raft configuration"), body)
        out = self.ok("members", "promote", 4)
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(out["message"], "node 4 is a voter now", out)

        def four_voters():
            st = self.status(ids=[1, 2, 3])
            n4 = [n for n in st["nodes"] if n["id"] == 4]
            if (st["voters"] == 4 and st["reachable_voters"] == 4 and n4 and
                    n4[0]["role"] == "follower" and n4[0]["member_role"] == "voter"):
                return st
            return None
        st = wait_for(four_voters, 30, "node 4 to be a voting follower in status")
        self.assertEqual(st["warnings"], [])
        wait_for(lambda: http_request(new.http, "GET", "/readyz", timeout=5)[0] == 200, 30,
                 "node 4 to be ready as a voter")
        self.assertEqual(len(st["nodes"]), 4)  # found through the members list
        out = self.ok("members", "remove", 4)
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(out["message"], "node 4 is out of the configuration; it can be stopped",
                         out)
        self.assertNotIn("leader_moved_to", out)  # a follower's removal moves nothing

        def three_voters():
            st = self.status(ids=[1, 2, 3])
            ids = sorted(m["id"] for m in st["members"])
            return st if ids == [1, 2, 3] and st["voters"] == 3 else None
        st = wait_for(three_voters, 30, "node 4 to leave the configuration")
        self.assertNotIn(4, [n["id"] for n in st["nodes"]])
        # Node 4 still runs: named in --cluster, status shows it and says it is no member.
        st = self.status(ids=[1, 2, 3, 4])
        self.assertTrue(any(w.startswith("node 4 (") and "is not a member" in w
                            for w in st["warnings"]), st["warnings"])
        self.assertEqual(len([w for w in st["warnings"] if "is not a member" in w]), 1,
                         st["warnings"])
        self.assertEqual(self.claim("after-remove")["outcome"], ACQ)
        # The leader sends it nothing more: it falls behind, and that is no lag warning
        # (the one above says what to do with it).
        st = self.status("--max-lag", "0", ids=[1, 2, 3, 4])
        n4 = [n for n in st["nodes"] if n["id"] == 4][0]
        self.assertGreater(n4["lag"], 0, n4)
        self.assertEqual([w for w in st["warnings"] if w.startswith("node 4 (") and "lags" in w],
                         [], st["warnings"])

    def test_members_in_id_order(self):
        # Raft keeps members in the order they were added; list and status show them by ID.
        # Added as spares and never started: nothing else changes.
        n5, n4 = Node(5, self.c.root), Node(4, self.c.root)
        for n in (n5, n4):
            self.assertEqual(self.ok("members", "add", n.id, n.raft, n.rpc, n.http)["outcome"],
                             "ok")
        # (A follower may answer before it applied the last addition: each node's list is
        # awaited, bounded, before the order is checked.)
        for nid in (1, 2, 3):
            wait_for(lambda: len(self.ok("members", "list", ids=[nid])["members"]) == 5, 10,
                     "node %d to list the members added" % nid)
        out = self.ok("members", "list")
        self.assertEqual([m["id"] for m in out["members"]], [1, 2, 3, 4, 5], out)
        st = self.status(ids=[1, 2, 3])
        self.assertEqual([m["id"] for m in st["members"]], [1, 2, 3, 4, 5], st["members"])
        rc, text, err = self.human("members", "list")
        self.assertEqual(rc, 0, err)
        rows = [ln.split()[0] for ln in text.splitlines() if re.match(r"^\d+ ", ln)]
        self.assertEqual(rows, ["1", "2", "3", "4", "5"], text)
        for n in (4, 5):
            self.assertEqual(self.ok("members", "remove", n)["outcome"], "ok")

    def test_add_refuses_an_address_in_use(self):
        # A new member's addresses must be its own: another member's RPC address (a typo)
        # would send its clients to that node, and status, which finds nodes by address,
        # would never show the new one. Nothing is changed.
        lid = self.c.leader()
        other = self.c.nodes[lid]
        new = self.c.add_node(5)
        for addrs, what in (((new.raft, other.rpc, new.http), other.rpc),
                            ((new.raft, new.rpc, other.http), other.http),
                            ((other.rpc, new.rpc, new.http), other.rpc),
                            ((other.raft, new.rpc, new.http),
                             "member %d has this raft address already" % lid),
                            ((new.raft, new.rpc, new.rpc), "must differ")):
            out = self.ok("members", "add", 5, *addrs)
            self.assertEqual(out["outcome"], "invalid", (addrs, out))
            self.assertIn(what, out["error"])
        out = self.ok("members", "add", lid, new.raft, new.rpc, new.http)
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("member %d has this id already" % lid, out["error"])
        members = self.ok("members", "list")["members"]
        self.assertEqual(sorted(m["id"] for m in members), [1, 2, 3], members)
        self.assertEqual(self.ok("members", "add", 5, new.raft, new.rpc, new.http)["outcome"],
                         "ok")

    def test_add_refuses_an_address_written_otherwise(self):
        # Each address is taken in its canonical text (a port without leading zeros, an IPv4
        # address without, IPv6 in RFC 5952's form, an IPv4-mapped one as the IPv4 address, a
        # name in lower case) and compared as text: an address in use written another way
        # (a leading zero, IPv4-mapped IPv6) was taken as a new one. Every try but the first
        # is another member's address so written; nothing changes. (A name that resolves to
        # a member's address is not told apart: nothing is resolved to compare.)
        lid = self.c.leader()
        other = self.c.nodes[lid]
        raft_port, rpc_port = other.raft.rsplit(":", 1)[1], other.rpc.rsplit(":", 1)[1]
        before = self.ok("members", "list")["members"]
        for nid, (given, what) in enumerate((
                # (free ports have five digits, and idemctl refuses six: a port of four.)
                ({"rpc": "127.0.0.1:07001"},
                 "rpc address: the port must be 1..65535 without leading zeros"),
                ({"raft": "127.000.0.1:" + raft_port},
                 "raft address: the host is not a valid IPv4 address"),
                ({"raft": "[::ffff:127.0.0.1]:" + raft_port},
                 "member %d has this raft address already" % lid),
                ({"rpc": "[0:0::FFFF:7f00:1]:" + rpc_port},
                 "address %s is member %d's already" % (other.rpc, lid))), 5):
            new = Node(nid, self.c.root)  # only its addresses: never started
            addrs = [given.get(k, getattr(new, k)) for k in ("raft", "rpc", "http")]
            with self.subTest(addrs=addrs):
                out = self.ok("members", "add", nid, *addrs)
                self.assertEqual(out["outcome"], "invalid", out)
                self.assertIn(what, out["error"])
        self.assertEqual(self.ok("members", "list")["members"], before)

    def test_add_refuses_a_malformed_address(self):
        # idemctl checks the addresses' form before it sends them; the leader checks them
        # itself, for the RPC's other clients: straight over the RPC here. An address longer
        # than the field was cut short to fit before. Nothing changes.
        lid = self.c.leader()
        host, rpc_port = self.c.nodes[lid].rpc.rsplit(":", 1)
        before = self.ok("members", "list")["members"]
        for nid, (given, what) in enumerate((
                ({"rpc": "127.0.0.1"}, "rpc address: expected host:port"),
                ({"http": "127.0.0.1:0"}, "http address: the port must be 1..65535"),
                ({"raft": "127.0.0.1:65536"}, "raft address: the port must be 1..65535"),
                ({"raft": "::1:7001"}, "raft address: write an IPv6 address in brackets"),
                ({"raft": "[::1%lo]:7001"}, "raft address: the host is not a valid IPv6 address"),
                ({"rpc": "a host:7001"}, "rpc address: the host must be an IPv4 address, an IPv6 "
                                         "address in brackets or a host name"),
                ({"http": "1" * 300 + ":7001"}, "http address: the host is longer than")), 4):
            new = Node(nid, self.c.root)  # only its addresses: never started
            addrs = [given.get(k, getattr(new, k)) for k in ("raft", "rpc", "http")]
            add = _u(1, 1) + _u(2, nid) + b"".join(_field(3 + i, a.encode())
                                                   for i, a in enumerate(addrs))
            with socket.create_connection((host, int(rpc_port)), timeout=30) as s:
                s.sendall(_frame(_u(1, 7) + _field(3, self.c.admin.encode()) + _field(21, add)))
                fields, result = _read_frame(s)
            error = fields.get(4, b"").decode()
            with self.subTest(addrs=addrs):
                self.assertEqual(result.get(1), 12, error)  # OUTCOME_INVALID
                self.assertIn(what, error)
        self.assertEqual(self.ok("members", "list")["members"], before)

    def test_transfer_to_a_down_node_is_refused(self):
        # libraft 0.15 starts a transfer to a voter that is down: the leader stops taking
        # proposals until it times out, and the cluster was then without a leader for an
        # election (and idemctl, retrying the unavailable answer, started it again until
        # its deadline). The leader now refuses a voter it has not heard from.
        lid = self.c.leader()
        dead, live = [n for n in sorted(self.c.nodes) if n != lid]
        def leader_term():
            st = self.status()
            return st["leader_id"], [n["term"] for n in st["nodes"] if n["role"] == "leader"]
        before = leader_term()
        self.c.kill(dead)
        # Over an election timeout (600 ms here) without a word from it. The condition is
        # time itself, on the leader's clock, which a loaded machine only makes later: a
        # sleep is never shorter (nothing observable counts the time since it was heard).
        time.sleep(1.5)
        rc, out = self.c.ctl("transfer", dead, deadline=10000)
        self.assertEqual(rc, 3, out)
        self.assertEqual(out["outcome"], "unavailable", out)
        self.assertIn("node %d has not been heard from for " % dead, out["error"])
        self.assertIn("down or unreachable", out["error"])
        self.assertEqual(leader_term(), before)
        self.assertNotIn("no leader known", self.c.logs())
        self.assertEqual(self.claim("after-refused-transfer")["outcome"], ACQ)
        # "Any voter" goes to the one that is up.
        out = self.ok("transfer")
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(out["leader_id"], live, out)
        wait_for(lambda: self.c.leader() == live, 20, "node %d to lead" % live)

    def test_a_node_in_a_removed_members_place_is_not_ready(self):
        # Node 5 is added while down, the promote times out (the leader queues the catch-up
        # for 5's address), 5 is removed, leadership moves; then a fresh node 5 starts at
        # that address. libraft 0.15 still delivers what it queued: the new node follows
        # the old leader in the old term with the old entries, and /readyz said ready for
        # ever (a load balancer would send it traffic). It hears nothing more: not ready.
        n5 = Node(5, self.c.root)
        self.c.nodes[5] = n5
        self.c._write_config(n5, [])
        self.assertEqual(self.ok("members", "add", 5, n5.raft, n5.rpc, n5.http)["outcome"], "ok")
        self.assertEqual(self.c.ctl("members", "promote", 5, deadline=2000)[0], 3)
        wait_for(lambda: self.c.ctl("members", "remove", 5, deadline=2000)[1].get("outcome")
                 == "ok", 30, "node 5 to be removed")
        self.assertEqual(self.ok("transfer")["outcome"], "ok")
        self.c.start(5)

        def readyz():
            try:
                st, _, b = http_request(n5.http, "GET", "/readyz", timeout=2)
                return st, b.get("reason")
            except OSError:
                return None  # not listening yet
        wait_for(readyz, 30, "node 5's gateway")
        # It follows the old leader, from which it hears nothing more, with the old entries:
        # those made it a spare (the add), not a voter (the promote never came). Not ready,
        # saying so as soon as it has them, and stays so.
        st, reason = wait_for(lambda: (lambda r: r if r and r[1] and r[1].startswith(
            "this node is a spare") else None)(readyz()), 30, "node 5 to say it is a spare")
        self.assertEqual(st, 503, reason)
        seen = []
        for _ in range(10):  # 2 s: over three election timeouts
            seen.append(readyz())
            time.sleep(0.2)
        self.assertEqual([r[0] for r in seen], [503] * 10, seen)

    def test_promote_of_a_node_that_is_down_warns(self):
        # Node 4 is added but never started: the promote times out (Raft cannot catch it
        # up), is not sent again, and a warning says why before it goes.
        ghost = Node(4, self.c.root)
        out = self.ok("members", "add", 4, ghost.raft, ghost.rpc, ghost.http)
        self.assertEqual(out["outcome"], "ok", out)
        rc, text, err = self.human("members", "promote", "4", deadline=2000)
        self.assertEqual(rc, 3, (text, err))
        self.assertIn("warning: node 4 (%s) did not answer" % ghost.rpc, err)
        self.assertIn("a node that is down makes the promote time out", err)
        # Raft gives the catch-up up after a few rounds; then node 4 can be removed.
        wait_for(lambda: self.c.ctl("members", "remove", 4, deadline=2000)[0] == 0, 30,
                 "the promote to end and node 4 to be removed")
        st = wait_for(lambda: (lambda s: s if sorted(m["id"] for m in s["members"]) == [1, 2, 3]
                               else None)(self.status()), 20, "node 4 out of the configuration")
        self.assertEqual(st["voters"], 3)

    def test_a_node_added_under_another_id_is_named(self):
        # Node 5 started, then `members add 6` with its addresses (the wrong ID): the add is
        # taken (the addresses are new), but Raft reaches node 5 at member 6's address, and
        # node 5 refuses connections meant for node 6. status says what is wrong, and does
        # not advise `members add` for node 5 (refused: its addresses are member 6's now);
        # the promote warns before it goes, then times out; the logs name the wrong ID, not
        # the secret (cluster/transport.h).
        new = self.c.add_node(5)
        out = self.ok("members", "add", 6, new.raft, new.rpc, new.http)
        self.assertEqual(out["outcome"], "ok", out)
        want = ("member 6's rpc address %s is answered by node 5: the id given to `members "
                "add` (or the address) is wrong, and Raft cannot reach member 6 there"
                % new.rpc)
        advice = ("`idemctl members remove 6`, then `idemctl members add 5 %s %s %s`"
                  % (new.raft, new.rpc, new.http))

        def warned(ids):
            st = self.status(ids=ids)
            return st if any(w.startswith(want) for w in st["warnings"]) else None
        for ids in ([1, 2, 3], [1, 2, 3, 5]):
            st = wait_for(lambda: warned(ids), 20, "the wrong ID in status's warnings")
            self.assertIn(advice, [w for w in st["warnings"] if w.startswith(want)][0])
            self.assertEqual([w for w in st["warnings"] if "is not a member" in w], [],
                             st["warnings"])
        rc, text, err = self.human("status", ids=[1, 2, 3, 5])
        self.assertEqual(rc, 0, err)
        self.assertIn("\nwarning: " + want, text)
        self.assertNotIn("is not a member", text)
        # The promote: warned, sent, timed out.
        rc, text, err = self.human("members", "promote", "6", deadline=2000)
        self.assertEqual(rc, 3, (text, err))
        self.assertIn("idemctl: warning: " + want, err)
        wait_for(lambda: self.c.logs_contain(
            "raft connection to node 6 failed: the node at %s is node 5, not node 6 "
            % new.raft), 15, "the leader's log to name node 5")
        self.assertTrue(self.c.logs_contain(
            "asked for node 6, and this is node 5: its Raft configuration gives node 6 this "
            "node's raft address"), self.c.logs())
        # What the warning says to do: node 5 joins under its own ID.
        wait_for(lambda: self.c.ctl("members", "remove", 6, deadline=2000)[0] == 0, 30,
                 "the promote to end and member 6 to be removed")
        wait_for(lambda: 6 not in [m["id"] for m in self.ok("members", "list")["members"]], 20,
                 "member 6 out of the configuration")
        out = self.ok("members", "add", 5, new.raft, new.rpc, new.http)
        self.assertEqual(out["outcome"], "ok", out)
        out = self.ok("members", "promote", 5)
        self.assertEqual(out["outcome"], "ok", out)
        st = wait_for(lambda: (lambda s: s if s["voters"] == 4 and s["reachable_voters"] == 4
                               and not s["warnings"] else None)(self.status(ids=[1, 2, 3])),
                      30, "node 5 a voter, and no warning")
        self.assertEqual(sorted(n["id"] for n in st["nodes"]), [1, 2, 3, 5])

    def test_members_added_with_a_wrong_address_are_named(self):
        # Member 4 added with a wrong raft address (nothing listens there): node 4 answers
        # at member 4's rpc address, and says where it listens for Raft. Member 6 added with
        # node 5's raft address and other (unused) rpc and http addresses: node 5 answers
        # but is no member, and its raft address is member 6's, so adding it is refused
        # until member 6 goes.
        n4 = self.c.add_node(4)
        wrong = Node(99, self.c.root)  # only its addresses: never started
        out = self.ok("members", "add", 4, wrong.raft, n4.rpc, n4.http)
        self.assertEqual(out["outcome"], "ok", out)
        n5 = self.c.add_node(5)
        out = self.ok("members", "add", 6, n5.raft, wrong.rpc, wrong.http)
        self.assertEqual(out["outcome"], "ok", out)
        want4 = ("member 4's raft address is %s in the Raft configuration, but node 4 (%s) "
                 "listens for Raft at %s: the raft address given to `members add` is wrong, "
                 "and Raft cannot reach member 4" % (wrong.raft, n4.rpc, n4.raft))
        advice4 = ("`idemctl members remove 4`, then `idemctl members add 4 %s %s %s`"
                   % (n4.raft, n4.rpc, n4.http))
        want5 = ("node 5 (%s) answers but is not a member of the Raft configuration, and its "
                 "raft address %s is member 6's there" % (n5.rpc, n5.raft))
        advice5 = ("`idemctl members remove 6`, then `idemctl members add 5 %s %s %s`"
                   % (n5.raft, n5.rpc, n5.http))

        def warned():
            st = self.status(ids=[1, 2, 3, 5])
            w4 = [w for w in st["warnings"] if w.startswith(want4)]
            w5 = [w for w in st["warnings"] if w.startswith(want5)]
            return (st, w4[0], w5[0]) if w4 and w5 else None
        st, w4, w5 = wait_for(warned, 20, "both in status's warnings")
        self.assertIn(advice4, w4)
        self.assertIn(advice5, w5)
        self.assertEqual([w for w in st["warnings"]
                          if "or `idemctl members add` it" in w], [], st["warnings"])
        self.assertIn("node 6 (%s) is unreachable" % wrong.rpc, " | ".join(st["warnings"]))
        rc, text, err = self.human("members", "promote", "4", deadline=2000)
        self.assertEqual(rc, 3, (text, err))
        self.assertIn("idemctl: warning: " + want4, err)

    def test_removing_the_leader_moves_leadership_first(self):
        # Removed while leading, a node steps down once the change commits, and the cluster
        # had no leader (every request unavailable) for an election: 1.1 s here. idemctl
        # hands leadership to another voter first, so a leader is there when it returns.
        # Right after another change (a promote), as when a node replaces the leader: the
        # new leader refuses a change until it has committed the last one (its first
        # entry), and idemctl sends the removal again then.
        new = self.c.add_node(4)
        self.assertEqual(self.ok("members", "add", 4, new.raft, new.rpc, new.http)["outcome"],
                         "ok")
        self.assertEqual(self.ok("members", "promote", 4)["outcome"], "ok")
        lid = self.c.leader()
        rc, text, err = self.human("members", "remove", str(lid))
        self.assertEqual(rc, 0, (text, err))
        others = [n for n in sorted(self.c.nodes) if n != lid]
        st = self.status(ids=others)
        self.assertNotIn(st["leader_id"], (None, lid), st)
        self.assertEqual(st["voters"], 3, st)
        self.assertIn("idemctl: note: node %d leads: handing leadership to another voter "
                      "before removing it" % lid, err)
        self.assertIn("message: node %d is out of the configuration; it can be stopped "
                      "(leadership moved to node %d first)" % (lid, st["leader_id"]), text)
        self.c.kill(lid)
        self.assertEqual(self.claim("after-leader-removed")["outcome"], ACQ)
        # Again, with --json, at once.
        second = st["leader_id"]
        rest = [n for n in others if n != second]
        out = self.ok("members", "remove", second)
        self.assertEqual(out["outcome"], "ok", out)
        self.assertIn(out["leader_moved_to"], rest, out)
        st = self.status(ids=rest)
        self.assertEqual((st["leader_id"], st["voters"]), (out["leader_moved_to"], 2), st)
        self.assertEqual(self.claim("with-two-voters")["outcome"], ACQ)

    def test_removing_the_leader_past_a_silent_node(self):
        # A node of --cluster that takes connections and never answers costs each discovery
        # the whole deadline. Removing the leader makes two: the transfer goes where the
        # first found the leader, the second finds the new one (before, the transfer made
        # one of its own: three deadlines). The silent node counts the connections.
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(0.2)
        accepted, stop = [], threading.Event()

        def take():
            while not stop.is_set():
                try:
                    accepted.append(silent.accept()[0])
                except socket.timeout:
                    continue
        t = threading.Thread(target=take)
        t.start()
        try:
            lid = self.c.leader()
            cluster = self.c.addrs() + ",127.0.0.1:%d" % silent.getsockname()[1]
            rc, text, err = run_ctl(["--cluster", cluster, "--admin-token", self.c.admin,
                                     "--deadline", "2000", "members", "remove", str(lid)])
            self.assertEqual(rc, 0, (text, err))
            self.assertIn("leadership moved to node", text)
            self.assertEqual(len(accepted), 2, (text, err))
        finally:
            stop.set()
            t.join()
            for conn in accepted:
                conn.close()
            silent.close()
        others = [n for n in sorted(self.c.nodes) if n != lid]
        st = self.status(ids=others)
        self.assertNotIn(st["leader_id"], (None, lid), st)
        self.assertEqual(st["voters"], 2, st)

    def test_a_restarted_node_holds_its_last_change_uncommitted_until_applied(self):
        # libraft 0.15 takes the last configuration entry of the log it loads as committed;
        # the raft I/O wrapper marks it uncommitted until the node applies it again
        # (docs/raft-0.15.md, 32). A follower restarted right after a change says so,
        # applies it as it catches up, and then, leading, changes the membership.
        new = self.c.add_node(4)
        self.assertEqual(self.ok("members", "add", 4, new.raft, new.rpc, new.http)["outcome"],
                         "ok")
        lid = self.c.leader()
        fid = [n for n in (1, 2, 3) if n != lid][0]
        self.c.kill(fid)
        self.c.start(fid)
        wait_for(lambda: self.c.logs_contain("is taken as uncommitted until this node applies "
                                             "it again"), 30, "node %d's start to mark it" % fid)
        self.assertEqual(self.claim("after-restart")["outcome"], ACQ)
        # A transfer goes only to a voter the leader has heard from lately: until it has,
        # refused (nothing moves), and asked again.
        wait_for(lambda: (self.c.ctl("transfer", fid)[1] or {}).get("outcome") == "ok", 20,
                 "a transfer to node %d" % fid)
        wait_for(lambda: self.status()["leader_id"] == fid, 20, "node %d to lead" % fid)
        # Uncommitted for good, its changes would be refused ("settling") until the deadline.
        out = self.ok("members", "promote", 4)
        self.assertEqual(out["outcome"], "ok", out)
        st = self.status()
        self.assertEqual((st["leader_id"], st["voters"]), (fid, 4), st)

    def test_spares_do_not_hide_the_leader(self):
        # Spares are sent no heartbeats and know no leader: status must find the leader by
        # the voters' answers. With two spares up and one voter stopped, counting every
        # answer left the leader without a majority (2 of 4): "no leader", and promote and
        # remove refused, the very steps of replacing a node that is down.
        for nid in (4, 5):
            new = self.c.add_node(nid)
            self.assertEqual(self.ok("members", "add", nid, new.raft, new.rpc,
                                     new.http)["outcome"], "ok")
        lid = self.c.leader()
        down = [n for n in (1, 2, 3) if n != lid][0]
        self.c.nodes[down].proc.send_signal(signal.SIGSTOP)
        try:
            st = self.status()
            self.assertEqual((st["leader_id"], st["quorum"]), (lid, True), st)
            self.assertEqual(self.ok("members", "promote", 4)["outcome"], "ok")
            out = self.ok("members", "remove", down)
            self.assertEqual(out["outcome"], "ok", out)
        finally:
            self.c.nodes[down].proc.send_signal(signal.SIGCONT)
        st = self.status(ids=[lid])
        self.assertEqual((st["leader_id"], st["voters"]), (lid, 3), st)

    def test_a_change_never_committed_is_rolled_back_after_a_restart(self):
        # The case the start-up marking exists for (docs/raft-0.15.md, 32). A leader whose
        # followers are both down appends an addition it cannot commit, and is killed. The
        # followers come back, elect one of them and write their own entries where the
        # change was. The old leader, restarted, must hold the change uncommitted and roll it
        # back when those entries overwrite it: libraft 0.15 alone takes it as committed and
        # keeps, for good, a member (node 4, a spare) that the cluster never had.
        lid = self.c.leader()
        others = [n for n in (1, 2, 3) if n != lid]
        for n in others:
            self.c.kill(n)
        # Addresses nobody listens on: a node 4 that answered the old leader could help it
        # commit the change.
        raft4, rpc4, http4 = ("127.0.0.1:%d" % free_port() for _ in range(3))
        rc, out = self.c.ctl("members", "add", 4, raft4, rpc4, http4, ids=[lid], deadline=300)
        self.assertNotEqual(rc, 0, out)  # it cannot commit
        self.c.kill(lid)
        with open(self.c.nodes[lid].log, "rb") as f:
            seen = len(f.read())
        for n in others:
            self.c.start(n)
        self.c.wait_leader(timeout=30, ids=others)
        for i in range(3):
            self.assertEqual(self.ok("claim", "over-the-change-%d" % i, "--fingerprint", fp(1),
                                     ids=others)["outcome"], ACQ)
        self.c.start(lid)

        def marked():
            with open(self.c.nodes[lid].log, "rb") as f:
                text = f.read()[seen:].decode(errors="replace")
            m = re.search(r"the log's last configuration \(entry (\d+)\) is taken as "
                          r"uncommitted until this node applies it again", text)
            return m and int(m.group(1))
        self.assertGreater(wait_for(marked, 30, "node %d's start to mark its change" % lid), 1)
        # Once it has caught up (its own answer: members list is answered by the node asked,
        # from its own configuration), it lists the three members the cluster has.
        self.assertEqual(self.ok("claim", "after-the-restart", "--fingerprint", fp(1),
                                 ids=others)["outcome"], ACQ)

        def own_members(nid):
            out = self.ok("members", "list", ids=[nid])
            self.assertEqual(out["node_id"], nid, out)
            return sorted((m["id"], m["role"]) for m in out["members"])
        three = [(1, "voter"), (2, "voter"), (3, "voter")]
        def caught_up():
            st = self.status(ids=[lid])
            return [n["lag"] for n in st["nodes"] if n["id"] == lid] == [0]
        wait_for(caught_up, 30, "node %d to catch up" % lid)
        for nid in (1, 2, 3):
            self.assertEqual(own_members(nid), three, nid)

    def test_last_voter_is_not_removed(self):
        # Down to one voter, removing it is refused (libraft 0.15 would take it out, and a
        # cluster without voters never elects a leader again, restarts included).
        lid = self.c.leader()
        for n, left in zip([n for n in sorted(self.c.nodes) if n != lid], (2, 1)):
            out = self.ok("members", "remove", n, ids=[lid])
            self.assertEqual(out["outcome"], "ok", out)
            wait_for(lambda: self.status(ids=[lid])["voters"] == left, 30,
                     "%d voter(s) left" % left)
        out = self.ok("members", "remove", lid, ids=[lid])
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("node %d is the last voter" % lid, out.get("error", ""), out)
        st = self.status(ids=[lid])
        self.assertEqual((st["voters"], st["leader_id"]), (1, lid), st)
        self.assertEqual(self.ok("claim", "after-refusal", "--fingerprint", fp(1),
                                 ids=[lid])["outcome"], ACQ)

    def test_transfer_to_named_node(self):
        lid = self.c.leader()
        target = [n for n in sorted(self.c.nodes) if n != lid][-1]
        out = self.ok("transfer", target)
        self.assertEqual(out["outcome"], "ok", out)
        # The answer names the new leader (the old one's view when the transfer ended).
        self.assertEqual(out["leader_id"], target, out)
        self.assertEqual(out["message"], "node %d leads now" % target, out)
        st = wait_for(lambda: (lambda s: s if s["leader_id"] == target else None)(self.status()),
                      20, "node %d to lead" % target)
        roles = {n["id"]: n["role"] for n in st["nodes"]}
        self.assertEqual(roles[target], "leader")
        self.assertTrue(st["quorum"])
        # To any voter, in the human format: the line names the node status then shows.
        rc, text, err = self.human("transfer")
        self.assertEqual(rc, 0, err)
        m = re.search(r"^leader_id: (\d+)$", text, re.M)
        self.assertIsNotNone(m, text)
        now = int(m.group(1))
        self.assertNotEqual(now, target, text)
        self.assertIn("node %d leads now" % now, text)
        wait_for(lambda: self.c.leader() == now, 20, "node %d to lead" % now)

    def test_transfer_answer_names_the_new_leader(self):
        # The node's own answer, not idemctl's fallback to status (for older nodes): a
        # transfer's ok carries leader_id (Response field 12), the node that leads now.
        lid = self.c.leader()
        target = [n for n in sorted(self.c.nodes) if n != lid][0]
        transfer = bytes([0x08]) + _uvarint(target)
        body = (bytes([0x08, 7, 0x10]) + _uvarint(10000) + _field(3, self.c.admin.encode())
                + _field(22, transfer))
        host, port = self.c.nodes[lid].rpc.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as s:
            s.sendall(_frame(body))
            fields, result = _read_frame(s)
        self.assertEqual(fields.get(1), 7, fields)
        self.assertEqual(result.get(1, 0), 8, (fields, result))  # OUTCOME_OK
        self.assertEqual(fields.get(12), target, fields)
        wait_for(lambda: self.c.leader() == target, 20, "node %d to lead" % target)

    def test_transfer_refusals_say_why(self):
        lid = self.c.leader()
        for fmt in ("json", "human"):
            if fmt == "json":
                out = self.ok("transfer", lid)
                self.assertEqual(out["outcome"], "invalid", out)
                text = out["error"]
            else:
                rc, text, err = self.human("transfer", str(lid))
                self.assertEqual(rc, 0, err)
            self.assertIn("node %d is already the leader" % lid, text)
        new = self.c.add_node(4)
        self.assertEqual(self.ok("members", "add", 4, new.raft, new.rpc, new.http)["outcome"],
                         "ok")
        out = self.ok("transfer", 4)
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("node 4 is not a voter (role spare)", out["error"])
        out = self.ok("transfer", 9)
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("node 9 is not a member", out["error"])
        # promote and remove of a non-member say so too, not raft's "server ID is not valid".
        for action in ("promote", "remove"):
            out = self.ok("members", action, 9)
            self.assertEqual(out["outcome"], "invalid", out)
            self.assertIn("node 9 is not a member (members: 1, 2, 3, 4)", out["error"])
            self.assertIn("node_error", out)
        # node_error is the leader's answer to this request: libraft 0.15 leaves its last
        # message in place when a refusal sets none, and the remove's was the promote's.
        out = self.ok("members", "promote", lid)
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("already", out.get("node_error", "") + out.get("error", ""), out)
        out = self.ok("members", "remove", 9)
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertNotIn("already", out["node_error"], out)
        self.assertEqual(self.c.leader(), lid)

    def test_snapshot_goes_to_the_leader(self):
        lid = self.c.leader()
        followers = [n for n in sorted(self.c.nodes) if n != lid]
        order = followers + [lid]  # --cluster names a follower first
        rc, out = self.c.ctl("snapshot", ids=order)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual((out["node_id"], out["node"]), (lid, self.c.nodes[lid].rpc), out)
        self.claim("after-snapshot")  # an applied entry, on every node
        wait_for(lambda: {n["id"]: n for n in self.status()["nodes"]}[lid]
                 ["last_snapshot_index"] > 0, 20, "the leader's snapshot")
        for n in self.c.wait_converged(3)["nodes"]:
            if n["id"] != lid:
                self.assertEqual(n["last_snapshot_index"], 0, n)
        rc, text, err = self.human("snapshot", ids=order)
        self.assertEqual(rc, 0, err)
        self.assertIn("node: %s\n" % self.c.nodes[lid].rpc, text)
        self.assertIn("node_id: %d\n" % lid, text)
        # --node still picks the node.
        rc, out = self.c.ctl("snapshot", "--node", self.c.nodes[followers[0]].rpc)
        self.assertEqual((rc, out["outcome"], out["node"]),
                         (0, "ok", self.c.nodes[followers[0]].rpc), out)


class TestIdemctlKeys(CtlTest):
    def test_key_get_shows_digest_not_key(self):
        key = "very-secret-key-4711"
        out = self.claim(key, n=7)
        token = out["token"]
        self.ok("complete", key, "--token", token, "--status", 201, "--body", "body-of-4711")
        for fmt in ("json", "human"):
            if fmt == "json":
                rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--admin-token",
                                         self.c.admin, "--json", "key", "get", "alpha", key])
                rec = json.loads(text)
            else:
                rc, text, err = self.human("key", "get", "alpha", key)
            self.assertEqual(rc, 0, err)
            self.assertNotIn(key, text + err)
            self.assertNotIn("very-secret", text + err)
            self.assertNotIn("body-of", text + err)  # nor the stored body
            self.assertIn(key_digest("alpha", key, self.c.raft_secret), text)
        self.assertEqual(rec["outcome"], "ok")
        self.assertEqual(rec["tenant"], "alpha")
        self.assertEqual(rec["key_digest"], key_digest("alpha", key, self.c.raft_secret))
        self.assertNotIn("key", rec)
        self.assertEqual(rec["state"], "completed")
        self.assertEqual(rec["completion"], "succeeded")
        self.assertEqual(rec["token"], token)
        self.assertEqual(rec["fingerprint_prefix"], fp(7)[:12])
        self.assertEqual(rec["response"]["status"], 201)
        self.assertEqual(rec["response"]["body_bytes"], len("body-of-4711"))
        self.assertNotIn("body", rec["response"])
        for t in ("created_at_ms", "lease_deadline_ms", "expires_at_ms"):
            self.assertGreater(rec[t], 1600000000000)
        self.assertLess(rec["created_at_ms"], rec["expires_at_ms"])
        # --reveal shows the key and the stored body.
        rev = self.ok("key", "get", "alpha", key, "--reveal")
        self.assertEqual(rev["key"], key)
        self.assertEqual(rev["response"]["body"], "body-of-4711")
        rc, text, err = self.human("key", "get", "alpha", key, "--reveal")
        self.assertIn("key: %s" % key, text)
        # Tenants stay apart; an unknown key is not_found (an answer: exit 0).
        self.assertEqual(self.ok("key", "get", "beta", key)["outcome"], "not_found")
        self.assertEqual(self.ok("key", "get", "alpha", "nope")["outcome"], "not_found")

    def test_quarantine_list_and_resolve(self):
        self.assertEqual(self.ok("quarantine", "list"),
                         {"outcome": "ok", "count": 0, "lease_ended": False, "more": False,
                          "limit": 100, "records": []})
        rc, text, err = self.human("quarantine", "list")
        self.assertEqual((rc, text.strip()), (0, "no quarantined records"), err)
        key = "payment-timeout-1"
        a = self.claim(key, n=1)
        self.ok("claim", "done-key", "--fingerprint", fp(2))
        out = self.ok("complete", key, "--token", a["token"], "--status", 504, "--outcome",
                      "unknown")
        self.assertEqual(out["outcome"], "ok")
        self.assertEqual(self.claim(key, n=1)["outcome"], "outcome_unknown")
        # Its own token cannot end the quarantine with another outcome (lease_lost, as a
        # release after complete); the same outcome again is a repeat (ok).
        out = self.ok("complete", key, "--token", a["token"], "--status", 200, "--body", "x")
        self.assertEqual(out["outcome"], "lease_lost", out)
        self.assertIn("another outcome", out["detail"], out)
        out = self.ok("complete", key, "--token", a["token"], "--status", 504, "--outcome",
                      "unknown")
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(self.claim(key, n=1)["outcome"], "outcome_unknown")
        lst = self.ok("quarantine", "list")
        self.assertEqual((lst["count"], lst["more"]), (1, False), lst)
        r = lst["records"][0]
        self.assertEqual((r["tenant"], r["key_digest"], r["token"], r["state"]),
                         ("alpha", key_digest("alpha", key, self.c.raft_secret), a["token"],
                          "quarantined"))
        self.assertEqual(r["since_ms"], r["created_at_ms"])
        self.assertNotIn("key", r)
        self.assertEqual(self.ok("quarantine", "list", "--tenant", "beta")["records"], [])
        self.assertEqual(self.ok("quarantine", "list", "--tenant", "alpha")["count"], 1)
        rc, text, err = self.human("quarantine", "list")
        self.assertEqual(rc, 0, err)
        self.assertIn(key_digest("alpha", key, self.c.raft_secret), text)
        self.assertNotIn(key, text)
        self.assertEqual(self.ok("quarantine", "list", "--reveal")["records"][0]["key"], key)
        # key resolve with a final response ends it: the list is empty, retries replay.
        out = self.ok("key", "resolve", "alpha", key, "--status", 200, "--body", "refunded")
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(self.ok("quarantine", "list")["records"], [])
        out = self.claim(key, n=1)
        self.assertEqual(out["outcome"], "replay")
        self.assertEqual(out["response"]["body"], "refunded")
        # The older spelling still works (alias), here with --release: the key runs again.
        b = self.claim("payment-timeout-2", n=3)
        self.ok("complete", "payment-timeout-2", "--token", b["token"], "--status", 504,
                "--outcome", "unknown")
        self.assertEqual(self.ok("quarantine", "list")["count"], 1)
        out = self.ok("resolve", "payment-timeout-2", "--tenant", "alpha", "--release")
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(self.ok("quarantine", "list")["count"], 0)
        self.assertEqual(self.claim("payment-timeout-2", n=3)["outcome"], ACQ)
        self.assertEqual(self.ok("key", "resolve", "alpha", "never-seen", "--release")["outcome"],
                         "not_found")
        # Resolve ends an unknown outcome only: a claim whose lease is live stays its
        # holder's, and a completed record keeps its answer (invalid, nothing changed).
        c = self.claim("settled-1", n=4)
        out = self.ok("key", "resolve", "alpha", "settled-1", "--release")
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("lease is live", out["detail"], out)
        self.ok("complete", "settled-1", "--token", c["token"], "--status", 201, "--body", "paid")
        for args in (["--release"], ["--status", 200, "--body", "operator"]):
            out = self.ok("key", "resolve", "alpha", "settled-1", *args)
            self.assertEqual(out["outcome"], "invalid", out)
            self.assertIn("completed", out["detail"], out)
        out = self.claim("settled-1", n=4)
        self.assertEqual((out["outcome"], out["response"]["body"]), ("replay", "paid"), out)

    def test_quarantine_list_lease_ended(self):
        # A claim whose holder went away (no complete, no release) answers a retry (another
        # attempt's) lease_expired (409) under the conflict policy once its lease has ended,
        # until an operator resolves it; --lease-ended lists such records, oldest first, with
        # when the lease ended. Live leases, completed and quarantined records are not listed.
        # (5 s: the checks before it ends take several idemctl runs on a slow machine.)
        gone = self.ok("claim", "gone-1", "--fingerprint", fp(1), "--lease", 5000)
        self.assertEqual(self.ok("quarantine", "list", "--lease-ended")["count"], 0)
        self.ok("claim", "live-1", "--fingerprint", fp(1), "--lease", 60000)
        q = self.ok("claim", "quar-1", "--fingerprint", fp(1), "--lease", 1000)
        self.ok("complete", "quar-1", "--token", q["token"], "--status", 504, "--outcome",
                "unknown")
        wait_for(lambda: self.claim("gone-1")["outcome"] == "lease_expired", 30,
                 "gone-1's lease to end")
        lst = self.ok("quarantine", "list", "--lease-ended")
        self.assertEqual((lst["count"], lst["lease_ended"], lst["more"]), (1, True, False), lst)
        r = lst["records"][0]
        self.assertEqual((r["tenant"], r["key_digest"], r["token"], r["state"]),
                         ("alpha", key_digest("alpha", "gone-1", self.c.raft_secret), gone["token"],
                          "processing"))
        self.assertEqual(r["since_ms"], r["lease_deadline_ms"])
        self.assertEqual(r["lease_deadline_ms"], gone["lease_deadline_ms"], (r, gone))
        self.assertEqual(self.ok("quarantine", "list", "--lease-ended", "--reveal")
                         ["records"][0]["key"], "gone-1")
        self.assertEqual(self.ok("quarantine", "list", "--lease-ended", "--tenant", "beta")
                         ["count"], 0)
        # The quarantined one is on the other list only.
        self.assertEqual([x["key_digest"] for x in self.ok("quarantine", "list")["records"]],
                         [key_digest("alpha", "quar-1", self.c.raft_secret)])
        rc, text, err = self.human("quarantine", "list", "--lease-ended")
        self.assertEqual(rc, 0, err)
        self.assertIn("LEASE ENDED (UTC)", text)
        self.assertIn(key_digest("alpha", "gone-1", self.c.raft_secret), text)
        self.assertNotIn("gone-1", text)
        # Resolved (it did not run: release), it is off the list and the key runs again.
        out = self.ok("key", "resolve", "alpha", "gone-1", "--release")
        self.assertEqual(out["outcome"], "ok", out)
        rc, text, err = self.human("quarantine", "list", "--lease-ended")
        self.assertEqual((rc, text.strip()),
                         (0, "no records in processing whose lease has ended"), err)
        self.assertEqual(self.claim("gone-1")["outcome"], ACQ)

    def test_lease_ended_on_an_idle_cluster(self):
        # The state machine's clock moves only with commands: --lease-ended goes by the time
        # its read barrier was proposed, so a lease that ended while nothing else happened
        # is listed (before, not until some other command came).
        gone = self.ok("claim", "idle-gone", "--fingerprint", fp(1), "--lease", 1000)
        wait_for(lambda: self.ok("quarantine", "list", "--lease-ended")["count"] == 1, 15,
                 "the ended lease to be listed with no other command")
        r = self.ok("quarantine", "list", "--lease-ended")["records"][0]
        self.assertEqual((r["token"], r["lease_deadline_ms"]),
                         (gone["token"], gone["lease_deadline_ms"]), r)
        self.assertEqual(self.ok("key", "resolve", "alpha", "idle-gone", "--release")["outcome"],
                         "ok")

    def test_live_lease_outlasts_the_ttl(self):
        # A 60 s lease on a 1 s ttl: at the ttl the claim stays its holder's (not a
        # tombstone); the control with a 1 s lease is tombstoned in the same time, so the
        # expiry did run.
        live = self.ok("claim", "long-job", "--fingerprint", fp(1), "--lease", 60000,
                       "--ttl", 1000)
        self.ok("claim", "short-job", "--fingerprint", fp(1), "--lease", 1000, "--ttl", 1000)
        wait_for(lambda: self.claim("short-job")["outcome"] == "expired", 30,
                 "the control to expire")
        self.assertEqual(self.claim("long-job")["outcome"], "in_progress")
        out = self.ok("renew", "long-job", "--token", live["token"], "--lease", 60000)
        self.assertEqual(out["outcome"], "ok", out)
        out = self.ok("complete", "long-job", "--token", live["token"], "--status", 200,
                      "--body", "ran")
        self.assertEqual(out["outcome"], "ok", out)

    def test_quarantine_list_limit(self):
        tokens = []
        for i, tenant_token in enumerate([self.c.token, self.c.token2, self.c.token]):
            rc, a = self.c.ctl("claim", "q-%d" % i, "--fingerprint", fp(i), token=tenant_token)
            self.assertEqual(a["outcome"], ACQ)
            tokens.append(a["token"])
            rc, out = self.c.ctl("complete", "q-%d" % i, "--token", a["token"], "--status", 500,
                                 "--outcome", "unknown", token=tenant_token)
            self.assertEqual(out["outcome"], "ok")
        lst = self.ok("quarantine", "list")
        self.assertEqual([r["token"] for r in lst["records"]], tokens)  # oldest first
        self.assertEqual([r["tenant"] for r in lst["records"]], ["alpha", "beta", "alpha"])
        lst = self.ok("quarantine", "list", "--limit", 2)
        self.assertEqual((lst["count"], lst["more"], lst["limit"]), (2, True, 2))
        self.assertEqual([r["token"] for r in lst["records"]], tokens[:2])
        rc, text, err = self.human("quarantine", "list", "--limit", "2")
        self.assertEqual(rc, 0, err)
        self.assertIn("more quarantined records than --limit 2", text.splitlines()[-1])
        lst = self.ok("quarantine", "list", "--limit", 3)
        self.assertEqual((lst["count"], lst["more"]), (3, False))

    def test_purge(self):
        a = self.claim("refunded-order", n=1)
        self.ok("complete", "refunded-order", "--token", a["token"], "--status", 201,
                "--body", "x" * 100)
        self.c.wait_converged(3)
        before = {n["id"]: (n["records"], n["bytes"]) for n in self.status()["nodes"]}
        self.assertEqual(set(before.values()), {(1, len("refunded-order") + 32 + 100 + 5)},
                         before)
        out = self.ok("key", "purge", "alpha", "refunded-order")
        self.assertEqual(out, {"outcome": "ok", "purged_token": a["token"]})
        self.assertEqual(self.ok("key", "get", "alpha", "refunded-order")["outcome"], "not_found")
        self.assertEqual(self.ok("get", "refunded-order")["outcome"], "not_found")
        # Every replica deleted it, usage included.
        st = self.c.wait_converged(3)
        for n in st["nodes"]:
            self.assertEqual((n["records"], n["bytes"]), (0, 0), n)
        # Idempotent: nothing left to delete.
        self.assertEqual(self.ok("key", "purge", "alpha", "refunded-order")["outcome"],
                         "not_found")
        # The key is new again: a claim runs, with a larger fencing token.
        b = self.claim("refunded-order", n=2)
        self.assertEqual(b["outcome"], ACQ)
        self.assertGreater(b["token"], a["token"])

    def test_purge_and_resolve_are_sent_once(self):
        # Committing them takes longer than an attempt's share of the deadline (both
        # followers paused for 0.45 s; deadline 900 ms, an attempt 300 ms). Sent again, each
        # was applied twice and answered as the repeat: the purge not_found for the record
        # it deleted, the resolve invalid for the answer it stored.
        lid = self.c.leader()
        others = [n for n in sorted(self.c.nodes) if n != lid]
        a = self.claim("purged-once", n=1)
        b = self.claim("resolved-once", n=2)
        self.ok("complete", "resolved-once", "--token", b["token"], "--status", 504,
                "--outcome", "unknown")
        self.c.wait_converged(3)

        def paused(args):
            for n in others:
                self.c.nodes[n].proc.send_signal(signal.SIGSTOP)
            timer = threading.Timer(0.45, lambda: [self.c.nodes[n].proc.send_signal(
                signal.SIGCONT) for n in others])
            timer.start()
            try:
                return self.c.ctl(*args, ids=[lid], deadline=900)
            finally:
                timer.join()
        rc, out = paused(["key", "purge", "alpha", "purged-once"])
        self.assertEqual((rc, out), (0, {"outcome": "ok", "purged_token": a["token"]}))
        rc, out = paused(["key", "resolve", "alpha", "resolved-once", "--status", 201, "--body",
                          "done"])
        self.assertEqual((rc, out["outcome"]), (0, "ok"), out)
        got = self.ok("key", "get", "alpha", "resolved-once")
        self.assertEqual((got["state"], got["response"]["status"]), ("completed", 201), got)

    def test_unknown_tenant_is_refused_not_not_found(self):
        # A mistyped tenant in an admin command: the record of the right one exists, and the
        # answer must say the tenant is unknown, not not_found (which reads as "gone").
        self.claim("typo-order", n=1)
        for args in (["key", "get", "alpah", "typo-order"],
                     ["key", "purge", "alpah", "typo-order"],
                     ["key", "resolve", "alpah", "typo-order", "--release"],
                     ["quarantine", "list", "--tenant", "alpah"]):
            out = self.ok(*args)
            self.assertEqual(out["outcome"], "invalid", (args, out))
            self.assertIn("unknown tenant", out["error"], (args, out))
        self.assertEqual(self.ok("key", "get", "alpha", "typo-order")["outcome"], "ok")
        self.assertEqual(self.ok("quarantine", "list", "--tenant", "alpha")["outcome"], "ok")

    def test_tenant_removed_from_the_configuration_keeps_its_records_in_reach(self):
        # A quarantined record never expires: once its tenant left the configuration, an
        # operator must still be able to list, read and resolve (or purge) it. The tenant
        # is known to the replicated state, so it is no "unknown tenant".
        key = "left-tenant-order"
        a = self.ok("claim", key, "--fingerprint", fp(1), token=self.c.token2)
        self.ok("complete", key, "--token", a["token"], "--status", 504, "--outcome", "unknown",
                token=self.c.token2)
        beta = "  - name: beta\n    token_sha256: %s\n" % sha256_hex(self.c.token2)
        self.restart_with_config(beta, "")
        lst = wait_for(lambda: (lambda o: o if o["outcome"] == "ok" else None)(
            self.ok("quarantine", "list", "--tenant", "beta")), 30, "the quarantine list")
        self.assertEqual(lst["count"], 1, lst)
        self.assertEqual(self.ok("key", "get", "beta", key)["state"], "quarantined")
        self.assertEqual(self.ok("key", "resolve", "beta", key, "--release")["outcome"], "ok")
        self.assertEqual(self.ok("key", "get", "beta", key)["outcome"], "not_found")
        # A name neither configured nor in the records is still refused.
        out = self.ok("key", "get", "betta", key)
        self.assertEqual(out["outcome"], "invalid", out)
        self.assertIn("unknown tenant", out["error"])

    def test_purge_tombstone(self):
        a = self.claim("short-lived", ttl=800)
        self.ok("complete", "short-lived", "--token", a["token"], "--status", 200, "--body", "ok")
        wait_for(lambda: self.ok("key", "get", "alpha", "short-lived")["state"] == "tombstone",
                 15, "the record to become a tombstone")
        self.assertEqual(self.claim("short-lived")["outcome"], "expired")
        self.assertEqual(self.ok("key", "purge", "alpha", "short-lived")["outcome"], "ok")
        self.assertEqual(self.claim("short-lived")["outcome"], ACQ)
        st = self.c.wait_converged(3)
        for n in st["nodes"]:
            self.assertEqual((n["records"], n["tombstones"]), (1, 0), n)

    def test_tenant_token_is_forbidden(self):
        a = self.claim("guarded", n=1)
        self.ok("complete", "guarded", "--token", a["token"], "--status", 504, "--outcome",
                "unknown")
        self.c.wait_converged(3)
        digest_before = self.c.wait_converged(3)["nodes"][0]["digest"]
        for args in (["key", "get", "alpha", "guarded"], ["key", "purge", "alpha", "guarded"],
                     ["key", "resolve", "alpha", "guarded", "--release"],
                     ["resolve", "guarded", "--tenant", "alpha", "--status", 200],
                     ["quarantine", "list"], ["members", "list"], ["members", "remove", 3],
                     ["transfer"], ["snapshot"]):
            rc, out = run_ctl_json(["--cluster", self.c.addrs(), "--admin-token", self.c.token]
                                   + args)
            # An answer that refused the token: exit 4 (a credential error, for scripts).
            self.assertEqual(rc, 4, (args, out))
            self.assertEqual(out["outcome"], "forbidden", (args, out))
            self.assertNotIn("records", out)
        rc, out = run_ctl_json(["--cluster", self.c.addrs(), "--admin-token", "not-a-token",
                                "key", "get", "alpha", "guarded"])
        self.assertEqual((rc, out["outcome"]), (4, "unauthenticated"))
        # status: every node refuses, a credential error (exit 4, test_refused_token).
        rc, st = run_ctl_json(["--cluster", self.c.addrs(), "--admin-token", self.c.token,
                               "status"])
        self.assertEqual((rc, st["outcome"]), (4, "forbidden"), st)
        self.assertEqual({n["role"] for n in st["nodes"]}, {"refused"})
        # Nothing changed: the same state everywhere, still quarantined, still 3 members.
        st = self.c.wait_converged(3)
        self.assertEqual({n["digest"] for n in st["nodes"]}, {digest_before})
        self.assertEqual(self.ok("key", "get", "alpha", "guarded")["state"], "quarantined")
        self.assertEqual(len(self.ok("members", "list")["members"]), 3)

    def test_empty_body_is_an_empty_string(self):
        a = self.claim("no-content", n=1)
        self.ok("complete", "no-content", "--token", a["token"], "--status", 204)
        out = self.claim("no-content", n=1)
        self.assertEqual(out["outcome"], "replay", out)
        self.assertEqual(out["response"]["body"], "", out)
        self.assertNotIn("body_base64", out["response"])
        rec = self.ok("key", "get", "alpha", "no-content", "--reveal")
        self.assertEqual((rec["response"]["body"], rec["response"]["body_bytes"]), ("", 0), rec)
        self.assertNotIn("body_base64", rec["response"])
        for args in (["key", "get", "alpha", "no-content", "--reveal"],
                     ["claim", "no-content", "--fingerprint", fp(1)]):
            rc, text, err = self.human(*args)
            self.assertEqual(rc, 0, err)
            self.assertIn("response.body: (empty)\n", text, args)
            self.assertNotIn("body_base64", text, args)

    def test_environment_instead_of_flags(self):
        env = {"IDEM_CLUSTER": self.c.addrs(), "IDEM_TOKEN": self.c.token,
               "IDEM_ADMIN_TOKEN": self.c.admin}
        rc, text, err = run_ctl(["--json", "claim", "env-key", "--fingerprint", fp(1)], env=env)
        self.assertEqual(json.loads(text)["outcome"], ACQ, err)
        rc, text, err = run_ctl(["--json", "key", "get", "alpha", "env-key"], env=env)
        self.assertEqual((rc, json.loads(text)["outcome"]), (0, "ok"), err)
        rc, text, err = run_ctl(["status", "--json"], env=env)
        self.assertEqual((rc, json.loads(text)["quorum"]), (0, True), err)
        # Flags win over the environment.
        rc, text, err = run_ctl(["--admin-token", self.c.token, "--json", "key", "get", "alpha",
                                 "env-key"], env=env)
        self.assertEqual((rc, json.loads(text)["outcome"]), (4, "forbidden"))

    def test_bench_alias(self):
        rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--token", self.c.token, "bench",
                                 "--workload", "fresh", "--concurrency", "2", "--requests", "20",
                                 "--json"])
        self.assertEqual(rc, 0, err)
        report = json.loads(text)
        self.assertEqual(report.get("errors"), 0, report)
        self.assertGreaterEqual(report.get("ops", 0), 20, report)

    def test_bench_progress_line(self):
        base = ["--cluster", self.c.addrs(), "--token", self.c.token, "bench", "--workload",
                "fresh", "--duration", "3", "--no-histogram"]
        # Closed loop: nothing is scheduled, so there is no lag behind a schedule to show.
        rc, out, tty = run_with_tty_stderr(base + ["--concurrency", "2"])
        self.assertEqual(rc, 0, tty)
        self.assertIn("ops/s", tty)
        self.assertNotIn("lag", tty)
        rc, out, tty = run_with_tty_stderr(base + ["--rate", "50"])
        self.assertEqual(rc, 0, tty)
        self.assertIn("max lag", tty)


    def test_bench_progress_counts_answered_ops_only(self):
        # Tenant beta may hold 10 records: a fresh run gets 10 acquired, then only
        # quota_exceeded (errors). The progress line's ops are what the summary calls ops
        # (answered as expected), its errors the summary's errors: a failure is never an op.
        beta = "    token_sha256: %s\n" % sha256_hex(self.c.token2)
        self.restart_with_config(beta, beta + "    max_records: 10\n")
        # The loop, then the threads (the 10 records are held by then: no op at all).
        for extra, acquired in (([], 10), (["--threads"], 0)):
            rc, out, tty = run_with_tty_stderr(["--cluster", self.c.addrs(), "--token",
                                                self.c.token2, "bench", "--workload", "fresh",
                                                "--duration", "3", "--concurrency", "2",
                                                "--json"] + extra)
            self.assertEqual(rc, 0, tty)
            report = json.loads(out)
            self.assertEqual(report["ops"], acquired, report)
            self.assertGreater(report["errors"], 0, report)
            self.assertEqual(report["outcomes"].get("quota_exceeded"), report["errors"], report)
            lines = re.findall(r"\[\s*\d+s\] (\d+) ops, \d+ ops/s, (\d+) errors", tty)
            self.assertTrue(lines, tty)
            for ops, errors in lines:
                self.assertLessEqual(int(ops), report["ops"], (extra, lines, report))
                self.assertLessEqual(int(errors), report["errors"], (extra, lines, report))
            # Counted once the quota ran out (the first line comes a second in).
            self.assertTrue(any(int(e) > 0 for _, e in lines), (extra, lines, report))


OUTCOME_OK, OUTCOME_UNAVAILABLE, OUTCOME_NOT_LEADER = 8, 13, 14


def _u(num, v):
    return _uvarint(num << 3) + _uvarint(v)


class TestIdemctlHealth(CtlTest):
    """Scripting and health: status --check and its exit status, exit 4 for a refused (or
    missing) token while business outcomes stay 0, version, -o json, /livez."""

    def check(self, *extra, ids=None, admin=None):
        """idemctl status --check ...; returns (rc, the --json object, stderr)."""
        a = ["--cluster", self.c.addrs(ids if ids is not None else sorted(self.c.nodes)),
             "--admin-token", admin or self.c.admin, "--json", "status", "--check"]
        rc, text, err = run_ctl(a + list(extra))
        return rc, json.loads(text), err

    def test_check_healthy_then_a_node_down_then_no_quorum(self):
        rc, st, err = self.check()
        self.assertEqual(rc, 0, (st, err))
        self.assertEqual(st["check"], {"ok": True, "max_lag_entries": 1000, "max_lag_ms": 5000,
                                       "failed": []})
        self.assertNotIn("check failed", err)
        rc, text, err = self.human("status", "--check", ids=sorted(self.c.nodes))
        self.assertEqual(rc, 0, err)
        self.assertEqual(text.splitlines()[-1], "check: ok", text)
        # Without --check, no "check" (and the same exit status as before).
        self.assertNotIn("check", self.status())
        # One voter down: exit 5, and the failed check names it (the cluster still serves).
        lid = self.c.leader()
        victim = [n for n in sorted(self.c.nodes) if n != lid][0]
        self.c.kill(victim)
        rc, st, err = self.check()
        self.assertEqual(rc, 5, (st, err))
        self.assertFalse(st["check"]["ok"], st)
        name = "voter %d (%s) is unreachable" % (victim, self.c.nodes[victim].rpc)
        self.assertEqual(len(st["check"]["failed"]), 1, st["check"])
        self.assertTrue(st["check"]["failed"][0].startswith(name), st["check"])
        self.assertIn("idemctl: status --check failed: " + name, err)
        self.assertTrue(st["quorum"], st)
        # Given only the survivors, the down voter is still found (through the configuration).
        rc, st, err = self.check(ids=[n for n in sorted(self.c.nodes) if n != victim])
        self.assertEqual(rc, 5, (st, err))
        self.assertIn(name, err)
        rc, text, err = self.human("status", "--check", ids=sorted(self.c.nodes))
        self.assertEqual(rc, 5, err)
        self.assertEqual(text.splitlines()[-1], "check: failed", text)
        self.assertIn(name, err)
        # Plain status still exits 0: a node answered.
        self.assertEqual(self.human("status")[0], 0)
        # A second voter down: no quorum, and (once the survivor gives up its leader) no
        # leader either.
        self.c.kill([n for n in sorted(self.c.nodes) if n not in (victim, lid)][0])
        rc, st, err = self.check()
        self.assertEqual(rc, 5, (st, err))
        self.assertIn("idemctl: status --check failed: no quorum: 1 of 3 voters reachable", err)
        wait_for(lambda: "no leader" in self.check()[2], 15, "the check to say: no leader")
        # Nothing reachable at all: 3, as status without --check.
        self.c.kill(lid)
        rc, text, err = self.human("status", "--check", ids=sorted(self.c.nodes), deadline=500)
        self.assertEqual(rc, 3, (text, err))

    def test_check_refused_token_exits_4(self):
        for token in ("not-a-token", self.c.token):
            rc, st, err = self.check(admin=token)
            self.assertEqual(rc, 4, (st, err))
            self.assertIn(st["outcome"], ("unauthenticated", "forbidden"))

    def test_refusals_exit_4_answers_exit_0(self):
        # Business outcomes are answers: exit 0.
        a = self.claim("biz", n=1)
        self.assertEqual(a["outcome"], ACQ)
        rc, out = self.c.ctl("claim", "biz", "--fingerprint", fp(1))
        self.assertEqual((rc, out["outcome"]), (0, "in_progress"), out)
        self.ok("complete", "biz", "--token", a["token"], "--status", 201)
        rc, out = self.c.ctl("claim", "biz", "--fingerprint", fp(1))
        self.assertEqual((rc, out["outcome"]), (0, "replay"), out)
        rc, out = self.c.ctl("claim", "biz", "--fingerprint", fp(2))
        self.assertEqual((rc, out["outcome"]), (0, "mismatch"), out)
        rc, text, err = self.human("claim", "biz", "--fingerprint", fp(2))
        self.assertEqual(rc, 0, err)
        self.assertIn("outcome: mismatch", text)
        rc, out = self.c.ctl("key", "get", "alpha", "nothing-here")
        self.assertEqual((rc, out["outcome"]), (0, "not_found"), out)
        # A bad tenant token: 4, with or without --json, and stderr says it.
        rc, out = self.c.ctl("claim", "biz", "--fingerprint", fp(1), token="not-a-token")
        self.assertEqual((rc, out["outcome"]), (4, "unauthenticated"), out)
        rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--token", "not-a-token", "get",
                                 "biz"])
        self.assertEqual(rc, 4, (text, err))
        self.assertIn("outcome: unauthenticated", text)
        self.assertIn("idemctl: get: the bearer token was refused (unauthenticated)", err)
        # The admin token on a data command, a tenant's or an unknown one on admin commands.
        rc, out = self.c.ctl("get", "biz", token=self.c.admin)
        self.assertEqual((rc, out["outcome"]), (4, "forbidden"), out)
        for admin, outcome in ((self.c.token, "forbidden"), ("not-a-token", "unauthenticated")):
            for args in (["key", "get", "alpha", "biz"], ["members", "list"], ["version"]):
                rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--admin-token", admin]
                                        + args)
                self.assertEqual(rc, 4, (args, text, err))
        # No token at all: 4 too (nothing sent).
        rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--json", "get", "biz"])
        self.assertEqual(rc, 4, (text, err))
        self.assertEqual(json.loads(text)["outcome"], "unauthenticated")
        self.assertIn("needs a bearer token", err)

    def test_version(self):
        p = subprocess.run([IDEMD, "--version"], stdout=subprocess.PIPE, timeout=30)
        idemd_version = p.stdout.decode().split()[-1]
        rc, text, err = run_ctl(["--version"])
        self.assertEqual(rc, 0, err)
        self.assertTrue(text.startswith("idemctl "), text)
        client = text.split()[-1]
        self.assertRegex(client, r"^\d+\.\d+\.\d+")
        self.assertEqual(client, idemd_version)  # one project, one version
        out = self.ok("version")
        self.assertEqual(out["client"], client)
        self.assertEqual([(n["id"], n["rpc_address"], n["version"]) for n in out["nodes"]],
                         [(i, self.c.nodes[i].rpc, idemd_version) for i in sorted(self.c.nodes)])
        rc, text, err = self.human("version")
        self.assertEqual(rc, 0, err)
        self.assertEqual(text.splitlines(),
                         ["client: %s" % client] +
                         ["node %d (%s): %s" % (i, self.c.nodes[i].rpc, idemd_version)
                          for i in sorted(self.c.nodes)])
        # --client: no cluster, no token needed.
        rc, text, err = run_ctl(["--json", "version", "--client"])
        self.assertEqual((rc, json.loads(text)), (0, {"client": client}), err)
        # A node down: its error instead of its version; still 0.
        self.c.kill(3)
        rc, out = self.c.ctl("version", ids=sorted(self.c.nodes))
        self.assertEqual(rc, 0, out)
        down = [n for n in out["nodes"] if n["id"] == 3][0]
        self.assertIsNone(down["version"], down)
        self.assertIn("error", down)

    def test_output_option(self):
        base = ["--cluster", self.c.addrs(), "--admin-token", self.c.admin]
        rc, want, err = run_ctl(base + ["--json", "members", "list"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(want)["outcome"], "ok")
        for args in (["-o", "json", "members", "list"], ["-o=json", "members", "list"],
                     ["members", "list", "-o", "json"], ["-o", "text", "members", "-o", "json"]):
            self.assertEqual(run_ctl(base + args)[:2], (0, want), args)
        rc, human, err = run_ctl(base + ["members", "list"])
        self.assertEqual(rc, 0, err)
        for args in (["-o", "text", "members", "list"], ["--json", "members", "-o", "text"]):
            self.assertEqual(run_ctl(base + args)[:2], (0, human), args)
        self.assertNotEqual(human, want)
        # A usage error after -o json is one JSON object, as with --json.
        rc, text, err = run_ctl(base + ["-o", "json", "status", "--bogus"])
        self.assertEqual((rc, json.loads(text)["outcome"]), (2, "usage"), err)
        rc, text, err = run_ctl(base + ["-o", "yaml", "status"])
        self.assertEqual((rc, text), (2, ""), err)
        self.assertIn("-o: expected json or text", err)

    def test_livez_without_quorum(self):
        for node in self.c.nodes.values():
            r = http_request(node.http, "GET", "/livez", timeout=5)
            self.assertEqual((r[0], r[2]), (200, {"status": "ok"}), r)
        self.assertEqual(http_request(self.c.nodes[1].http, "POST", "/livez", timeout=5)[0], 405)
        for nid in (2, 3):
            self.c.kill(nid)
        survivor = self.c.nodes[1].http
        wait_for(lambda: http_request(survivor, "GET", "/readyz", timeout=5)[0] == 503, 30,
                 "/readyz 503 without a quorum")
        r = http_request(survivor, "GET", "/livez", timeout=5)
        self.assertEqual((r[0], r[2]), (200, {"status": "ok"}), r)


class TestIdemctlHealthLag(CtlTest):
    # As TestIdemctlLag: a slow heartbeat, so that right after a claim the followers trail
    # the leader's applied index by an entry, for up to a second.
    cluster_opts = dict(heartbeat_ms=1000, election_ms=5000)

    def trailing_check(self, *extra):
        """status --check with `extra` right after claims, until a follower trails the
        leader (lag > 0 in the same status); returns (rc, status, stderr)."""
        for i in range(20):
            self.claim("hl-%d-%d" % (i, time.monotonic_ns()))
            rc, text, err = run_ctl(["--cluster", self.c.addrs(), "--admin-token",
                                     self.c.admin, "--json", "status", "--check"]
                                    + list(extra))
            st = json.loads(text)
            if any(n.get("lag") for n in st["nodes"]):
                return rc, st, err
        self.fail("no follower seen behind the leader in 20 tries")

    def test_lag_in_entries(self):
        rc, st, err = self.trailing_check("--max-lag-entries", "0")
        self.assertEqual(rc, 5, (st, err))
        failed = [f for f in st["check"]["failed"] if " lags: applied index " in f]
        self.assertTrue(failed, st["check"])
        self.assertIn("(more than --max-lag-entries 0)", failed[0])
        self.assertIn("idemctl: status --check failed: " + failed[0], err)

    def test_lag_in_time(self):
        # 1 ms: a follower that trails cannot catch up that fast, unless the leader's next
        # heartbeat (once a second) happens to fall between the status that showed the lag
        # and the second look, a few ms later; the check then rightly passes. That sample
        # says nothing, and another is taken (at most 5).
        for _ in range(5):
            rc, st, err = self.trailing_check("--max-lag-ms", "1")
            if rc != 0:
                break
            self.assertTrue(st["check"]["ok"], st)
        self.assertEqual(rc, 5, (st, err))
        failed = [f for f in st["check"]["failed"] if "within --max-lag-ms 1" in f]
        self.assertTrue(failed, st["check"])
        self.assertRegex(failed[0], r"^voter \d+ \(127\.0\.0\.1:\d+\) lags: it has not applied "
                                    r"index \d+, the leader's, within --max-lag-ms 1")
        # The default, 5000 ms: the follower applies the leader's index with the next
        # heartbeat, and the check passes (after waiting for it).
        rc, st, err = self.trailing_check()
        self.assertEqual(rc, 0, (st, err))
        self.assertTrue(st["check"]["ok"], st)


class FakeCluster:
    """Three fake nodes' RPC listeners on loopback that answer status as a shared `leader`
    says (0: none, an election) and hand every transfer to `on_transfer(fake, node, target)`,
    which returns (outcome, retry_after_ms, redirect address or "") or those and the
    answer's leader_id, and may change `leader`. A membership change is answered ok, and
    recorded in `changes` as (node asked, action, id, leader then).
    What idemctl transfer does after a leader answered that leadership did not move: a real
    cluster cannot be made to answer that on demand (raft 0.15 moved it to a SIGSTOPped
    target all the same). Records each transfer as (node asked, target, leader then)."""

    def __init__(self, on_transfer, on_change=None):
        self.on_transfer = on_transfer
        # on_change(fake, node, action, id): (outcome, redirect address or ""), when the
        # membership change is not to be answered ok.
        self.on_change = on_change
        self.leader = 1
        self.term = 2
        self.transfers = []
        self.changes = []
        self.lock = threading.Lock()
        self.stopping = False
        self.listeners = []
        self.addrs = []
        for _ in range(3):
            port = free_port()
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("127.0.0.1", port))
            ls.listen(16)
            ls.settimeout(0.2)
            self.listeners.append(ls)
            self.addrs.append("127.0.0.1:%d" % port)
        self.threads = [threading.Thread(target=self._accept, args=(i + 1, ls), daemon=True)
                        for i, ls in enumerate(self.listeners)]
        for t in self.threads:
            t.start()

    def set_leader(self, node):
        with self.lock:
            if node != self.leader:
                self.term += 1
            self.leader = node

    def close(self):
        self.stopping = True
        for t in self.threads:
            t.join(5)
        for ls in self.listeners:
            ls.close()

    def _accept(self, node, ls):
        while not self.stopping:
            try:
                conn, _ = ls.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self._serve, args=(node, conn), daemon=True).start()

    def _status(self, node):
        with self.lock:
            leader, term = self.leader, self.term
        members = b"".join(_field(18, _u(1, i + 1) + _field(2, b"127.0.0.1:1")
                                  + _field(3, a.encode()) + _field(5, b"voter"))
                           for i, a in enumerate(self.addrs))
        st = (_u(1, node) + _field(2, b"leader" if node == leader else b"follower")
              + _u(3, term) + _u(4, leader) + _u(6, 10) + _u(7, 10)
              + _field(15, self.addrs[node - 1].encode()) + members)
        if leader:
            st += _field(5, self.addrs[leader - 1].encode())
        return _field(2, _u(1, OUTCOME_OK)) + _field(5, st)

    def _serve(self, node, conn):
        conn.settimeout(10)
        with conn:
            while not self.stopping:
                try:
                    hdr = recv_exact(conn, 4)
                    if len(hdr) < 4:
                        return
                    body = recv_exact(conn, struct.unpack(">I", hdr)[0])
                except (OSError, socket.timeout):
                    return
                req = _fields(body)
                if 20 in req:
                    answer = self._status(node)
                elif 22 in req:
                    target = _fields(req[22]).get(1, 0)
                    with self.lock:
                        self.transfers.append((node, target, self.leader))
                    said = self.on_transfer(self, node, target)
                    outcome, wait, redirect = said[:3]
                    result = _u(1, outcome) + (_u(4, wait) if wait else b"")
                    answer = _field(2, result) + (_field(3, redirect.encode()) if redirect
                                                  else b"")
                    if outcome != OUTCOME_OK:
                        answer += _field(4, b"leadership did not move")
                    elif len(said) > 3:
                        answer += _u(12, said[3])
                elif 21 in req:
                    mr = _fields(req[21])
                    with self.lock:
                        self.changes.append((node, mr.get(1, 0), mr.get(2, 0), self.leader))
                    outcome, redirect = (self.on_change(self, node, mr.get(1, 0), mr.get(2, 0))
                                         if self.on_change else (OUTCOME_OK, ""))
                    answer = _field(2, _u(1, outcome)) + (_field(3, redirect.encode())
                                                          if redirect else b"")
                else:
                    answer = _field(2, _u(1, 12))
                conn.sendall(_frame(_u(1, req.get(1, 0)) + answer))


class TestIdemctlTransferSettle(unittest.TestCase):
    """idemctl transfer after the leader answered "did not move" (an UNAVAILABLE with
    retry_after_ms): the request goes again only to a leader status shows is the one asked,
    never to a redirect; a leader that changed means it moved after all; during an election
    it waits for one. Against FakeCluster (no idemd)."""

    def transfer(self, on_transfer, deadline=5000):
        fake = FakeCluster(on_transfer)
        self.addCleanup(fake.close)
        rc, text, err = run_ctl(["--cluster", ",".join(fake.addrs), "--admin-token", "adm",
                                 "--deadline", deadline, "--json", "transfer", 2], timeout=30)
        return fake, rc, json.loads(text) if text.strip() else None, err

    def test_a_late_move_is_not_sent_again(self):
        def late(fake, node, target):
            fake.set_leader(2)  # the election the transfer started ends after its answer
            return OUTCOME_UNAVAILABLE, 100, ""
        fake, rc, out, err = self.transfer(late)
        self.assertEqual(rc, 0, err)
        self.assertEqual((out["outcome"], out["leader_id"]), ("ok", 2), out)
        self.assertIn("after the leader had answered that it did not", out["message"])
        self.assertEqual(fake.transfers, [(1, 2, 1)])

    def test_the_same_leader_is_asked_again(self):
        def second_works(fake, node, target):
            if len(fake.transfers) == 1:
                return OUTCOME_UNAVAILABLE, 100, ""
            fake.set_leader(2)
            return OUTCOME_OK, 0, ""
        fake, rc, out, err = self.transfer(second_works)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out["outcome"], "ok", out)
        self.assertEqual(fake.transfers, [(1, 2, 1), (1, 2, 1)])

    def test_an_election_is_waited_for(self):
        def election(fake, node, target):
            if len(fake.transfers) == 1:
                fake.set_leader(0)  # no leader for 0.8 s, then node 1 again
                threading.Timer(0.8, fake.set_leader, (1,)).start()
                return OUTCOME_UNAVAILABLE, 100, ""
            fake.set_leader(2)
            return OUTCOME_OK, 0, ""
        t0 = time.monotonic()
        fake, rc, out, err = self.transfer(election)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out["outcome"], "ok", out)
        # Sent again only once node 1 led again: never while no leader was shown.
        self.assertEqual(fake.transfers, [(1, 2, 1), (1, 2, 1)])
        self.assertGreaterEqual(time.monotonic() - t0, 0.8)

    def test_a_redirect_after_the_resend_is_not_followed(self):
        def moved_elsewhere(fake, node, target):
            if len(fake.transfers) == 1:
                return OUTCOME_UNAVAILABLE, 100, ""
            fake.set_leader(3)  # leadership moved since, to another node
            return OUTCOME_NOT_LEADER, 0, fake.addrs[2]
        fake, rc, out, err = self.transfer(moved_elsewhere)
        self.assertEqual(rc, 0, err)
        self.assertEqual((out["outcome"], out["leader_id"]), ("ok", 3), out)
        self.assertEqual(fake.transfers, [(1, 2, 1), (1, 2, 1)])  # node 3 never asked

    def test_a_removal_after_the_handover_waits_for_the_new_leader(self):
        # members remove of the leader hands leadership over first. The transfer answers
        # ok once the old leader has stepped down, and the others learn of the new leader
        # from its first heartbeat: until then status shows none. The removal waits for
        # status to show the new leader, and goes to it (seen under load: "members: no
        # leader (as status shows)" after "leadership moved to node 2 first").
        def handover(fake, node, target):
            fake.set_leader(0)
            threading.Timer(0.6, fake.set_leader, (2,)).start()
            return OUTCOME_OK, 0, "", 2
        fake = FakeCluster(handover)
        self.addCleanup(fake.close)
        t0 = time.monotonic()
        rc, text, err = run_ctl(["--cluster", ",".join(fake.addrs), "--admin-token", "adm",
                                 "--json", "members", "remove", 1], timeout=30)
        self.assertEqual(rc, 0, (text, err))
        out = json.loads(text)
        self.assertEqual((out["outcome"], out["leader_moved_to"]), ("ok", 2), out)
        self.assertEqual(fake.transfers, [(1, 0, 1)])
        self.assertEqual(fake.changes, [(2, 3, 1, 2)])  # remove 1, asked of node 2 leading
        self.assertGreaterEqual(time.monotonic() - t0, 0.6)

    def test_no_leader_after_the_handover_sends_nothing(self):
        def gone(fake, node, target):
            fake.set_leader(0)
            return OUTCOME_OK, 0, "", 2
        fake = FakeCluster(gone)
        self.addCleanup(fake.close)
        rc, text, err = run_ctl(["--cluster", ",".join(fake.addrs), "--admin-token", "adm",
                                 "--deadline", 1500, "--json", "members", "remove", 1],
                                timeout=30)
        self.assertEqual(rc, 3, (text, err))
        out = json.loads(text)
        self.assertEqual((out["outcome"], out["leader_moved_to"], out["removed"]),
                         ("unavailable", 2, False), out)
        self.assertIn("then no leader showed in status within the deadline; node 1 was not "
                      "removed (nothing was sent)", out["error"], out)
        self.assertEqual(fake.changes, [])

    def test_no_leader_by_the_deadline_is_unavailable(self):
        def gone(fake, node, target):
            fake.set_leader(0)
            return OUTCOME_UNAVAILABLE, 100, ""
        fake, rc, out, err = self.transfer(gone, deadline=1500)
        self.assertEqual(rc, 3, err)
        self.assertEqual(out["outcome"], "unavailable", out)
        self.assertIn("did not move before the deadline", json.dumps(out))
        self.assertEqual(fake.transfers, [(1, 2, 1)])


def run_ctl_json(args):
    rc, text, err = run_ctl(["--json"] + args)
    try:
        return rc, json.loads(text)
    except ValueError:
        raise AssertionError("idemctl printed non-JSON: %r (stderr %r)" % (text, err))


# Every command and subcommand, for --help.
HELP_COMMANDS = [
    ["status"], ["members"], ["members", "list"], ["members", "add"], ["members", "promote"],
    ["members", "remove"], ["transfer"], ["snapshot"], ["key"], ["key", "get"],
    ["key", "resolve"], ["key", "purge"], ["quarantine"], ["quarantine", "list"], ["resolve"],
    ["claim"], ["complete"], ["release"], ["renew"], ["get"], ["version"],
]


class TestIdemctlRemoveRedirect(unittest.TestCase):
    """members remove when leadership moves, between status and the request, to the node
    being removed: the leader asked answers not_leader naming it. Followed, the redirect
    would have that node remove itself while it leads, with no handoff first. Against
    FakeCluster (no idemd: a real cluster cannot be made to move leadership at that
    moment)."""

    def test_no_removal_is_sent_to_the_node_removed(self):
        def moved(fake, node, action, nid):
            if node != 1:
                return OUTCOME_OK, ""  # node 3, leading, would remove itself
            fake.set_leader(3)
            return OUTCOME_NOT_LEADER, fake.addrs[2]
        fake = FakeCluster(lambda *a: (OUTCOME_OK, 0, ""), on_change=moved)
        self.addCleanup(fake.close)
        rc, text, err = run_ctl(["--cluster", ",".join(fake.addrs), "--admin-token", "adm",
                                 "--deadline", 3000, "--json", "members", "remove", 3],
                                timeout=30)
        self.assertEqual(rc, 3, (text, err))
        out = json.loads(text)
        self.assertEqual(out["outcome"], "unavailable", out)
        self.assertIn("the node being removed", out["error"], out)
        self.assertEqual(fake.changes, [(1, 3, 3, 1)])  # asked at node 1 only


class TestIdemctlUsage(unittest.TestCase):
    """No cluster needed: help and usage errors exit before any call (port 1 refuses)."""

    def test_help_on_every_command(self):
        rc, text, err = run_ctl(["--help"])
        self.assertEqual(rc, 0)
        self.assertTrue(text.startswith("Usage: idemctl"), text)
        for word in ("Exit status", "IDEM_CLUSTER", "IDEM_TOKEN", "IDEM_ADMIN_TOKEN",
                     "key purge", "quarantine list", "bench"):
            self.assertIn(word, text)
        for code in ("0  ", "1  ", "2  ", "3  ", "4  ", "5  "):
            self.assertIn("\n  " + code, text)
        for cmd in HELP_COMMANDS:
            for flag in ("--help", "-h"):
                rc, text, err = run_ctl(cmd + [flag])  # no cluster, no token
                self.assertEqual(rc, 0, (cmd, err))
                self.assertTrue(text.startswith("Usage: idemctl " + cmd[0]), (cmd, text))
                self.assertIn(" ".join(cmd), text)
                self.assertEqual(err, "")
            rc, text2, err = run_ctl(["help"] + cmd)
            self.assertEqual((rc, text2), (0, text), cmd)
        # A subcommand's own help, not only its command's.
        rc, text, err = run_ctl(["key", "purge", "--help"])
        self.assertIn("Deletes the record", text)
        rc, text, err = run_ctl(["quarantine", "list", "--help"])
        self.assertIn("--limit", text)
        rc, text, err = run_ctl(["bench", "--help"])
        self.assertEqual(rc, 0, err)
        self.assertTrue(text.startswith("Usage: idem-bench"), text)
        # `help --help` is idemctl's own help, as `help` alone is.
        rc, top, err = run_ctl(["--help"])
        for flag in ("--help", "-h"):
            self.assertEqual(run_ctl(["help", flag]), (0, top, ""))

    def test_help_in_an_options_value_is_a_value(self):
        # "-h" as the value of --body (or --token) is that value, not a request for help:
        # the command goes on and, with nothing listening, exits 3 without printing help.
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--deadline", "300"]
        for args in (["complete", "k", "--token", "1", "--status", "200", "--body", "-h"],
                     ["complete", "k", "--token", "1", "--status", "200", "--body", "--help"],
                     ["claim", "k", "--fingerprint", "ab" * 32, "--attempt", "-h"]):
            rc, text, err = run_ctl(c + args)
            self.assertEqual(rc, 3, (args, text, err))
            self.assertNotIn("Usage:", text + err, args)

    def test_bad_usage_exits_2(self):
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--admin-token", "a"]
        cases = [
            [], ["nope"], ["help", "nope"], ["--bogus", "status"],
            ["key"], ["key", "frob", "alpha", "k"], ["key", "get"], ["key", "get", "alpha"],
            ["key", "get", "alpha", "k", "extra"], ["key", "get", "", "k"],
            ["key", "get", "t" * 129, "k"], ["key", "get", "alpha", "k", "--release"],
            ["key", "purge", "alpha", "k", "--reveal"], ["key", "resolve", "alpha", "k"],
            ["key", "resolve", "alpha", "k", "--release", "--status", "200"],
            ["key", "resolve", "alpha", "k", "--status", "99"], ["key", "get", "alpha", "k", "--x"],
            ["quarantine", "nope"], ["quarantine", "list", "--limit", "0"],
            ["quarantine", "list", "--limit", "1001"], ["quarantine", "list", "--limit"],
            ["quarantine", "list", "--tenant", ""], ["status", "--max-lag", "x"],
            ["status", "--max-lag-entries", "x"], ["status", "--max-lag", "1",
                                                   "--max-lag-entries", "1"],
            ["status", "--max-lag-ms", "100"], ["status", "--check", "--max-lag-ms", "0"],
            ["status", "--check", "--max-lag-ms", "600001"], ["status", "--check=1"],
            ["version", "extra"], ["version", "--bogus"], ["-o", "yaml", "status"],
            ["status", "-o"],
            ["status", "extra"], ["members", "frob"], ["transfer", "x"],
            ["resolve", "k", "--release"], ["resolve", "k", "--tenant", "t" * 129, "--release"],
        ]
        for args in cases:
            rc, text, err = run_ctl(c + args)
            self.assertEqual(rc, 2, (args, text, err))
            self.assertIn("idemctl:", err, args)
            self.assertEqual(text, "", args)
        # Without a cluster: 2. Without the admin token: 4, a credential error (nothing sent).
        self.assertEqual(run_ctl(["--admin-token", "a", "key", "get", "alpha", "k"])[0], 2)
        rc, text, err = run_ctl(["--cluster", "127.0.0.1:1", "--token", "t", "quarantine", "list"])
        self.assertEqual((rc, text), (4, ""), err)
        self.assertIn("admin token", err)
        rc, text, err = run_ctl(["--cluster", "127.0.0.1:1", "--admin-token", "a", "get", "k"])
        self.assertEqual((rc, text), (4, ""), err)
        self.assertIn("needs a bearer token", err)

    def test_nothing_reachable_exits_3(self):
        c = ["--cluster", "127.0.0.1:1", "--admin-token", "a", "--deadline", "300"]
        for args in (["key", "get", "alpha", "k"], ["key", "purge", "alpha", "k"],
                     ["key", "resolve", "alpha", "k", "--release"], ["quarantine", "list"],
                     ["status"]):
            rc, text, err = run_ctl(c + ["--json"] + args)
            self.assertEqual(rc, 3, (args, err))
            out = json.loads(text)
            if args[0] == "status":
                self.assertFalse(out["quorum"])
                self.assertEqual([n["role"] for n in out["nodes"]], ["unreachable"])
                self.assertEqual(len(out["warnings"]), 2, out)  # unreachable, state unknown
            else:
                self.assertEqual(out["outcome"], "unavailable", args)

    def assert_usage_error(self, args):
        rc, text, err = run_ctl(args)
        self.assertEqual(rc, 2, (args, text, err))
        self.assertIn("idemctl:", err, args)
        self.assertEqual(text, "", args)
        return err

    def assert_sent(self, args):
        """Not a usage error: sent, and with nothing listening, exit 3."""
        rc, text, err = run_ctl(args)
        self.assertEqual(rc, 3, (args, text, err))

    def test_empty_attempt_is_a_usage_error(self):
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--deadline", "300", "claim", "k",
             "--fingerprint", "ab" * 32]
        for attempt in (["--attempt", ""], ["--attempt="]):
            self.assertIn("--attempt", self.assert_usage_error(c + attempt))
        self.assert_sent(c + ["--attempt", "a"])

    def test_response_status_is_200_to_599(self):
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--admin-token", "a", "--deadline",
             "300"]
        for code in ("100", "199", "600"):
            for args in (["complete", "k", "--token", "1", "--status", code],
                         ["key", "resolve", "alpha", "k", "--status", code],
                         ["resolve", "k", "--tenant", "alpha", "--status", code]):
                self.assertIn("200..599", self.assert_usage_error(c + args))
        for code in ("200", "599"):
            self.assert_sent(c + ["complete", "k", "--token", "1", "--status", code])
            self.assert_sent(c + ["key", "resolve", "alpha", "k", "--status", code])

    def test_node_ids_fit_in_int64(self):
        c = ["--cluster", "127.0.0.1:1", "--admin-token", "a", "--deadline", "300"]
        addrs = ["127.0.0.1:9004", "127.0.0.1:7004"]
        for nid in ("0", "9223372036854775808", "18446744073709551615"):
            for args in (["members", "add", nid] + addrs, ["members", "promote", nid],
                         ["members", "remove", nid], ["transfer", nid]):
                self.assertIn("1..9223372036854775807", self.assert_usage_error(c + args))
        for args in (["members", "add", "9223372036854775807"] + addrs,
                     ["transfer", "9223372036854775807"]):
            self.assert_sent(c + args)

    # A KEY may start with '-' (the key alphabet allows it) and may stand where an option or
    # one argument too many was: usage errors name its position, never its text.
    SECRET = "-s3cr3t-4711"

    def key_commands(self, key, extra=()):
        """Every command that takes a KEY, with `key` as the KEY and `extra` after it."""
        fpx = "ab" * 32
        return [
            ["key", "get", "alpha", key] + list(extra),
            ["key", "purge", "alpha", key] + list(extra),
            ["key", "resolve", "alpha", key, "--release"] + list(extra),
            ["resolve", key, "--tenant", "alpha", "--release"] + list(extra),
            ["claim", key, "--fingerprint", fpx] + list(extra),
            ["complete", key, "--token", "1", "--status", "200"] + list(extra),
            ["release", key, "--token", "1"] + list(extra),
            ["renew", key, "--token", "1"] + list(extra),
            ["get", key] + list(extra),
        ]

    def test_usage_errors_never_show_a_token(self):
        # A token option put after a command that takes no KEY, or a global option misspelt,
        # was quoted whole in the usage error; so was a value that is not a number (a
        # bearer token given as a fencing --token, say).
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--admin-token", "a"]
        tok = "SECRETXYZ-4711"
        cases = [[cmd, "--admin-token=" + tok] for cmd in
                 ("status", "members", "reload", "snapshot", "version")]
        cases += [["status", "--token=" + tok], ["--admin-tokn=" + tok, "status"],
                  ["complete", "k", "--token", tok, "--status", "200"]]
        for args in cases:
            for json_flag in ([], ["--json"]):
                rc, text, err = run_ctl(c + json_flag + args)
                self.assertEqual(rc, 2, (args, text, err))
                self.assertNotIn("SECRETXYZ", text + err, args)
                self.assertIn("not shown", err, args)

    def test_a_tls_file_that_cannot_load_is_a_configuration_error_with_node_alone(self):
        # reload and snapshot take --node without --cluster: the TLS files are checked
        # before anything is sent there too (exit 2, outcome error), not reported as the
        # node being unavailable (exit 3).
        for cmd in (["reload", "--node", "127.0.0.1:1"], ["snapshot", "--node", "127.0.0.1:1"]):
            rc, text, err = run_ctl(["--json", "--tls-ca", "/nonexistent/ca.crt",
                                     "--admin-token", "a"] + cmd)
            self.assertEqual(rc, 2, (cmd, text, err))
            self.assertEqual(json.loads(text)["outcome"], "error", (cmd, text))
            self.assertIn("/nonexistent/ca.crt", err)

    def test_usage_errors_never_show_a_key(self):
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--admin-token", "a", "--deadline",
             "300"]
        secret = self.SECRET
        # The KEY taken for an unknown option; a KEY (or anything) one argument too many.
        cases = ([(args, "option") for args in self.key_commands(secret)] +
                 [(args, "too many") for args in self.key_commands("k", [secret[1:]])] +
                 [(args, "too many") for args in self.key_commands(secret[1:], ["k"])])
        for args, kind in cases:
            for json_flag in ([], ["--json"]):
                rc, text, err = run_ctl(c + json_flag + args)
                self.assertEqual(rc, 2, (args, text, err))
                self.assertNotIn("s3cr3t", text + err, args)
                self.assertIn("idemctl: %s: argument " % args[0], err, args)
                if kind == "option":
                    self.assertIn("(not shown", err, args)
                    self.assertIn("--", err.split("(not shown", 1)[1], args)
                else:
                    self.assertIn("one argument too many", err, args)
                if json_flag:
                    self.assertEqual(json.loads(text)["outcome"], "usage", (args, text))
        # After --, a KEY that starts with '-' is a KEY: sent (nothing listens: exit 3).
        for args in self.key_commands("-k"):
            key_at = args.index("-k")
            args = args[:key_at] + args[key_at + 1:] + ["--", "-k"]
            self.assert_sent(c + args)
        # After --, every argument is an operand: an option there is one too many, and the
        # message says so without showing it.
        rc, text, err = run_ctl(c + ["get", "--", secret, "--json"])
        self.assertEqual((rc, text), (2, ""), err)
        self.assertIn("options go before --", err)
        self.assertNotIn("s3cr3t", err)
        # Commands without a KEY still quote what was wrong.
        rc, text, err = run_ctl(c + ["members", "list", "bogus"])
        self.assertEqual(rc, 2)
        self.assertIn('"bogus"', err)

    def test_usage_errors_with_json_print_one_object(self):
        c = ["--cluster", "127.0.0.1:1", "--token", "t", "--admin-token", "a"]
        cases = [
            c + ["--json", "key", "get", "alpha"],           # found after --json was parsed
            c + ["key", "get", "alpha", "--json"],           # --json after the command
            c + ["--bogus", "--json", "status"],             # found before --json
            c + ["status", "--max-lag", "x", "--json"],
            c + ["--json", "nope"], c + ["--json"], ["--json", "--token", "t", "get", "k"],
            c + ["--json", "quarantine", "list", "--limit", "0"],
            c + ["--json", "transfer", "0"],
            c + ["-o", "json", "transfer", "0"], c + ["transfer", "0", "-o=json"],
            ["--cluster", "127.0.0.1:1", "--json", "--tls-cert", "x.pem", "status"],
        ]
        for args in cases:
            rc, text, err = run_ctl(args)
            self.assertEqual(rc, 2, (args, text, err))
            self.assertEqual(len(text.splitlines()), 1, (args, text))
            out = json.loads(text)
            self.assertEqual(sorted(out), ["error", "outcome"], (args, out))
            self.assertEqual(out["outcome"], "usage", (args, out))
            # The same words as stderr's first line.
            self.assertEqual("idemctl: " + out["error"], err.splitlines()[0], args)
        # No admin token: exit 4 (a credential error), one object too, with stderr's words.
        rc, text, err = run_ctl(["--cluster", "127.0.0.1:1", "--json", "status"])
        self.assertEqual(rc, 4, (text, err))
        out = json.loads(text)
        self.assertEqual(out["outcome"], "unauthenticated", out)
        self.assertEqual("idemctl: " + out["error"], err.splitlines()[0])
        # A TLS file that cannot be loaded: a configuration error, one object too.
        rc, text, err = run_ctl(c + ["--json", "--tls-ca", "/nonexistent/ca.pem", "status"])
        self.assertEqual(rc, 2, err)
        self.assertEqual(json.loads(text)["outcome"], "error", text)
        # "--json" as an option's value, or after --, is no --json: stdout stays empty.
        for args in (c + ["complete", "k", "--token", "1", "--status", "99", "--body", "--json"],
                     c + ["get", "--", "k", "--json"]):
            rc, text, err = run_ctl(args)
            self.assertEqual((rc, text), (2, ""), (args, err))

    def test_help_of_bench_names_what_is_passed_on(self):
        rc, text, err = run_ctl(["help", "bench"])
        self.assertEqual(rc, 0, err)
        for flag in ("--cluster", "--token", "--json", "--deadline", "--tls", "--tls-ca",
                     "--tls-cert", "--tls-key", "--tls-server-name"):
            self.assertIn(flag, text, flag)


if __name__ == "__main__":
    unittest.main()
