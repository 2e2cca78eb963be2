"""Self-test of the runner's own bookkeeping (workload.py, cluster.py): what it must
notice about the processes it drives, so that the checker's "final" rule sees it.

Run: cd tests/chaos && python3 -m unittest -v test_runner
"""
import os
import random
import subprocess
import tempfile
import unittest

import cluster
import workload


class FakeHistory:
    def __init__(self):
        self.ops = []

    def write(self, op):
        self.ops.append(op)


def _driver(script, d, n=0):
    """A stand-in for client_driver serve, spawned as start_drivers() does."""
    path = os.path.join(d, "lib-driver-%d.log" % n)
    with open(path, "ab") as err:
        p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err)
    p.worker = "lib-%d" % n
    p.stderr_path = path
    return p


class DriverExitTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.wl = workload.Workload(None, None, FakeHistory(), 1, 1, 1, "takeover", 0.0,
                                    kinds=("lib",))

    def claim(self, driver):
        op = self.wl._base("lib-0", "lib", "claim", "c1-0", None)
        self.wl._lib_call(random.Random(1), driver, op,
                          ("claim", workload.fingerprint_of("c1-0"), "a1"))
        return op

    def test_driver_dying_mid_run_is_noted_with_status_and_stderr(self):
        p = _driver("read l; echo 'ERROR: AddressSanitizer: heap-use-after-free' >&2; "
                    "exit 7", self.dir.name)
        self.wl.drivers.append(p)
        op = self.claim(p)
        self.assertEqual(op["type"], "info")
        self.assertEqual(len(self.wl.driver_exits), 1)
        x = self.wl.driver_exits[0]
        self.assertEqual((x["driver"], x["status"], x["at"]), ("lib-0", 7, "during the run"))
        self.assertIn("heap-use-after-free", x["stderr_tail"])
        self.claim(p)
        self.wl.finish(timeout=1)
        self.assertEqual(len(self.wl.driver_exits), 1)  # noted once

    def test_driver_exiting_zero_mid_run_is_noted(self):
        p = _driver("exit 0", self.dir.name)
        p.wait()
        self.wl.drivers.append(p)
        self.wl.finish(timeout=1)
        self.assertEqual([(x["status"], x["at"]) for x in self.wl.driver_exits],
                         [(0, "during the run")])

    def test_driver_ending_cleanly_at_the_end_is_not_noted(self):
        p = _driver("cat >/dev/null; exit 0", self.dir.name)
        self.wl.drivers.append(p)
        self.wl.finish(timeout=1)
        self.assertEqual(self.wl.driver_exits, [])

    def test_driver_failing_at_the_end_of_its_input_is_noted(self):
        p = _driver("cat >/dev/null; echo 'LeakSanitizer: detected memory leaks' >&2; exit 23",
                    self.dir.name)
        self.wl.drivers.append(p)
        self.wl.finish(timeout=1)
        self.assertEqual([(x["status"], x["at"]) for x in self.wl.driver_exits],
                         [(23, "at the end of its input")])
        self.assertIn("LeakSanitizer", self.wl.driver_exits[0]["stderr_tail"])

    def test_stderr_tail_is_bounded(self):
        path = os.path.join(self.dir.name, "big.log")
        with open(path, "w") as f:
            for i in range(10000):
                f.write("line %d\n" % i)
        tail = workload.stderr_tail(path)
        self.assertTrue(tail.endswith("line 9999"))
        self.assertLessEqual(len(tail.splitlines()), 40)
        self.assertEqual(workload.stderr_tail(os.path.join(self.dir.name, "none")).split(":")[0],
                         "(unreadable")


class FinalSampleTest(unittest.TestCase):

    def wl(self):
        w = workload.Workload(None, None, FakeHistory(), 1, 1, 1, "takeover", 0.0)
        w.ack_times = [(float(i), "k%d" % i) for i in range(1000)]
        return w

    def test_keys_acknowledged_before_a_wipe_come_first(self):
        faults = [{"kind": "wipe", "t0": 500.5}, {"kind": "powercut", "t0": 900.2},
                  {"kind": "pause", "t0": 100.5}, {"window": "no_quorum", "t0": 1, "t1": 2}]
        keys = self.wl().final_sample(faults, limit=500)
        self.assertEqual(len(keys), 500)
        self.assertEqual(len(set(keys)), 500)
        self.assertEqual(keys[:6], ["k900", "k500", "k899", "k499", "k898", "k498"])
        self.assertNotIn("k100", keys[:6])
        self.assertEqual(keys, self.wl().final_sample(faults, limit=500))  # from the seed

    def test_every_key_when_fewer(self):
        w = self.wl()
        w.ack_times = w.ack_times[:30]
        self.assertEqual(sorted(w.final_sample([], limit=500)),
                         sorted(k for _, k in w.ack_times))


class NodeExitTest(unittest.TestCase):
    """Cluster.kill and Cluster.stop on a node whose process already ended."""

    def cluster(self, script):
        c = cluster.Cluster.__new__(cluster.Cluster)  # no network, no PKI: processes only
        c.early_exits = []
        node = cluster.Node.__new__(cluster.Node)
        node.id, node.paused, node.expected_exit = 2, False, False
        node.proc = subprocess.Popen(["sh", "-c", script])
        self.addCleanup(lambda: node.proc and (node.proc.kill(), node.proc.wait()))
        c.nodes = {2: node}
        return c, node

    def test_kill_of_a_node_that_crashed_notes_the_crash(self):
        c, node = self.cluster("kill -SEGV $$")
        node.proc.wait()  # it crashed; nobody polled it yet
        c.kill(2)
        self.assertEqual([(x["node"], x["status"], x["at"]) for x in c.early_exits],
                         [(2, -11, "found exited when killed")])
        self.assertIsNone(node.proc)

    def test_stop_of_a_node_that_exited_notes_the_exit(self):
        c, node = self.cluster("exit 3")
        node.proc.wait()
        self.assertEqual(c.stop(2), 3)
        self.assertEqual([(x["node"], x["status"]) for x in c.early_exits], [(2, 3)])

    def test_kill_of_a_running_node_notes_nothing(self):
        c, node = self.cluster("sleep 30")
        c.kill(2)
        self.assertEqual(c.early_exits, [])

    def test_an_expected_exit_is_not_noted(self):
        c, node = self.cluster("exit 0")
        c.expect_exit(2)  # a power cut kills it before the nemesis does
        node.proc.wait()
        c.kill(2)
        self.assertEqual(c.early_exits, [])


if __name__ == "__main__":
    unittest.main()
