"""Addresses (docs/configuration.md, docs/operations.md "Addresses, names and IPv6"): members
known by a host name (localhost, which /etc/hosts maps to 127.0.0.1), by an IPv6 address
([::1]), and a node that binds its Raft port on a wildcard (node.raft_listen 0.0.0.0:P) while
it is known by 127.0.0.1:P. Each cluster elects, replicates, answers through every node
(followers forward to the leader's RPC address, a name or [::1] here), lists its members by
their advertised addresses, and takes a member back after a restart (dialled, and its name
looked up, anew). What a node whose address changes under its name does is in
tests/unit/test_transport.c (and the chaos suite's network namespaces).

The wildcard bind is on the Raft port only, whose connections are authenticated with the
cluster's raft.secret_file (the harness sets one), for the few seconds of the test."""
import json
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ClusterTestCase, fp, http_request, wait_for  # noqa: E402


def ipv6_loopback():
    """Whether ::1 can be bound here (IPv6 on, the loopback address present)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


class AddressesTest(ClusterTestCase):
    """The checks every cluster of this file passes."""

    def node_log(self, nid):
        with open(self.c.nodes[nid].log, "rb") as f:
            return f.read().decode(errors="replace")

    def http_claim(self, nid, key, n):
        """A claim through node nid's JSON API (a follower forwards it to the leader)."""
        return http_request(self.c.nodes[nid].http, "POST", "/v1/claims",
                            body={"fingerprint": fp(n)},
                            headers={"Authorization": "Bearer %s" % self.c.token,
                                     "Idempotency-Key": key}, timeout=30)

    def serve_everywhere(self, tag):
        """A claim through each node's RPC (idemctl, given that node's address only: it
        follows the leader's address from there) and through each node's JSON API; the
        replicas converge."""
        lid = self.c.wait_leader(timeout=20)
        for nid in sorted(self.c.nodes):
            rc, out = self.c.ctl("claim", "%s-rpc-%d" % (tag, nid), "--fingerprint", fp(nid),
                                 ids=[nid])
            self.assertEqual((rc, out and out.get("outcome")), (0, "acquired"), (nid, out))

            def answered():
                r = self.http_claim(nid, "%s-http-%d" % (tag, nid), nid)
                return r if r[0] != 503 else None  # a follower between leaders: again
            status, _, body = wait_for(answered, 30, "node %d's gateway to answer" % nid)
            self.assertIn(status, (200, 201), (nid, lid, body))
            self.assertEqual(body.get("outcome"), "acquired", (nid, body))
        self.c.wait_converged(len(self.c.nodes))

    def check_members(self):
        """The members are listed by their advertised addresses, as configured."""
        rc, out = self.c.ctl("members", "list")
        self.assertEqual(rc, 0, out)
        got = {m["id"]: (m["raft_address"], m["rpc_address"], m["http_address"])
               for m in out["members"]}
        want = {n.id: (n.raft, n.rpc, n.http) for n in self.c.nodes.values()}
        self.assertEqual(got, want)

    def restart_follower(self, tag):
        """A follower stopped and started again is dialled anew and catches up."""
        lid = self.c.wait_leader(timeout=20)
        nid = next(n for n in sorted(self.c.nodes) if n != lid)
        self.assertEqual(self.c.stop(nid), 0)
        for i in range(5):
            rc, out = self.c.ctl("claim", "%s-%d" % (tag, i), "--fingerprint", fp(i),
                                 ids=[n for n in self.c.nodes if n != nid])
            self.assertEqual(rc, 0, out)
        self.c.start(nid)
        self.c.wait_converged(len(self.c.nodes), timeout=60)


class TestNamedAddresses(AddressesTest):
    """Nodes 1 and 2 known as localhost:P; node 3 as 127.0.0.1:P, its Raft listener on
    0.0.0.0:P and its RPC listener at localhost:P (a listen address that is a name)."""
    cluster_opts = {
        "hosts": {1: "localhost", 2: "localhost"},
        "listen": {3: {"raft_listen": "0.0.0.0:{raft}", "rpc_listen": "localhost:{rpc}"}},
    }

    def test_named_cluster(self):
        self.serve_everywhere("named")
        self.check_members()
        for nid in (1, 2):
            self.assertTrue(self.c.nodes[nid].raft.startswith("localhost:"))
        # Node 3 says where it listens; its Raft port takes a connection at another loopback
        # address than the one it is known by: it is bound to the wildcard.
        n3 = self.c.nodes[3]
        raft_port = int(n3.raft.rsplit(":", 1)[1])
        self.assertIn("raft on %s (listening on 0.0.0.0:%d)" % (n3.raft, raft_port),
                      self.node_log(3))
        with socket.create_connection(("127.0.0.2", raft_port), timeout=10):
            pass
        with self.assertRaises(OSError):  # the RPC listener is not: localhost is 127.0.0.1
            socket.create_connection(("127.0.0.2", int(n3.rpc.rsplit(":", 1)[1])),
                                     timeout=10).close()
        self.restart_follower("named-restart")
        self.serve_everywhere("named-after")


@unittest.skipUnless(ipv6_loopback(), "no IPv6 loopback address (::1) on this machine")
class TestIpv6Addresses(AddressesTest):
    """Nodes 1 and 2 known as [::1]:P, node 3 as localhost:P: Raft, the RPC, forwarding and
    idemctl over IPv6, beside a member reached over IPv4."""
    cluster_opts = {"hosts": {1: "[::1]", 2: "[::1]", 3: "localhost"}}

    def test_ipv6_cluster(self):
        self.serve_everywhere("v6")
        self.check_members()
        rc, out = self.c.ctl("status")
        self.assertEqual(rc, 0, out)
        self.assertEqual(len(out["nodes"]), 3, json.dumps(out))
        self.restart_follower("v6-restart")
        self.serve_everywhere("v6-after")


if __name__ == "__main__":
    unittest.main()
