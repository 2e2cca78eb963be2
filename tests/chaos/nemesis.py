"""nemesis: the faults of a chaos run, one at a time, at random intervals from the seed.

Kinds (--nemesis picks among them; each occurs in turn from a shuffled rotation, so a run
long enough sees every kind):
- kill: SIGKILL the leader (every other time) or a random voter; restart it 1-4 s later with
  the same argv.
- pause: SIGSTOP the leader (every other time) or a random voter for 1-4 s, then SIGCONT.
- quorum: SIGKILL two voters at once; restart them 2-4 s later. No node has a quorum from
  the second kill to the first restart (a window the checker holds every answer against).
- partition: in turn, cut a random voter off from the others, cut the leader off from both
  followers (each a window without quorum for requests sent to the cut node), or drop what
  one follower receives from the leader (a one-way cut); healed 2-5 s later.
- wipe: SIGKILL a follower, delete its data directory, restart it: it rejoins from a snapshot
  (the chaos config snapshots every 512 entries).
- membership: start a spare node, add it as a member, promote it to voter, then remove it and
  stop it: four voters for a while, under load.
- powercut: the node whose data directory is on the power-cut disk (powerdisk.py) loses
  power: it is frozen, its disk drops every write it had not synced, the node is SIGKILLed,
  the disk is mounted again from what had reached it, and the node restarts. Nothing acknowledged may
  be lost: the checker's no-execution-after-acknowledgement and one-result rules see it.

Runs on the runner's main thread (processes are started from it: cluster.spawn). Every
fault is written to nemesis.jsonl (history.py) once healed, with the leader as known when it
was injected. Nodes that exit without being asked are noted (the checker fails the run on
them) and restarted so the run goes on; one that crashed just before the nemesis came to
kill or stop it is noted by the cluster (Cluster.early_exits), not lost in the kill.
"""
import random
import time

from cluster import wait_until

KINDS = ("kill", "pause", "quorum", "partition", "wipe", "membership", "powercut")


class Nemesis:
    def __init__(self, cluster, net, log, seed, kinds, disk=None, disk_node=None):
        self.c = cluster
        self.net = net
        self.log = log
        self.rng = random.Random(seed)
        self.kinds = list(kinds)
        self.disk = disk
        self.disk_node = disk_node
        self.rotation = []
        self.unexpected = []  # [{"node", "status", "t"}]
        self.counts = {}
        self.leader_turn = False
        self.part_turn = 0

    # ---- helpers -------------------------------------------------------------------------

    def _sleep(self, seconds):
        """Sleeps, watching for nodes that exit on their own (restarted, and noted)."""
        end = time.monotonic() + seconds
        while True:
            for nid, rc in self.c.exited():
                self.unexpected.append({"node": nid, "status": rc, "t": time.monotonic()})
                self.c.start(nid)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    def _leader(self):
        return self.c.leader()

    def _target(self, leader):
        """The leader every other time (when one is known), else a random voter."""
        self.leader_turn = not self.leader_turn
        if self.leader_turn and leader in self.c.voters:
            return leader
        return self.rng.choice(self.c.voters)

    def _emit(self, kind, t0, nodes, leader, phase, detail=""):
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.log.write({"kind": kind, "t0": t0, "t1": time.monotonic(), "nodes": nodes,
                        "leader": leader is not None and leader in nodes, "phase": phase,
                        "detail": detail})

    def _window(self, t0, t1, nodes):
        self.log.write({"window": "no_quorum", "t0": t0, "t1": t1, "nodes": nodes})

    # ---- the loop --------------------------------------------------------------------------

    def run(self, until):
        """Injects faults until the monotonic time until (a fault under way is finished and
        healed; none starts in the last 3 s)."""
        self._sleep(self.rng.uniform(1.0, 2.0))
        while time.monotonic() < until - 3:
            if not self.rotation:
                self.rotation = list(self.kinds)
                self.rng.shuffle(self.rotation)
            kind = self.rotation.pop()
            getattr(self, "_" + kind)()
            self._sleep(self.rng.uniform(1.0, 3.0))

    def heal_all(self):
        """Everything back: partitions healed, paused nodes resumed, voters running."""
        self.net.heal()
        for nid in list(self.c.nodes):
            self.c.resume(nid)
        for nid, rc in self.c.exited():
            self.unexpected.append({"node": nid, "status": rc, "t": time.monotonic()})
        for nid in self.c.voters:
            if self.c.nodes[nid].proc is None:
                self.c.start(nid)

    # ---- the kinds -------------------------------------------------------------------------

    def _kill(self):
        leader = self._leader()
        nid = self._target(leader)
        t0 = time.monotonic()
        self.c.kill(nid)
        self._sleep(self.rng.uniform(1.0, 4.0))
        self.c.start(nid)
        self._emit("kill", t0, [nid], leader, "one_down")

    def _pause(self):
        leader = self._leader()
        nid = self._target(leader)
        t0 = time.monotonic()
        self.c.pause(nid)
        self._sleep(self.rng.uniform(1.0, 4.0))
        self.c.resume(nid)
        self._emit("pause", t0, [nid], leader, "one_down")

    def _quorum(self):
        leader = self._leader()
        a, b = self.rng.sample(self.c.voters, 2)
        self.c.kill(a)
        self.c.kill(b)
        # The fault (and its recovery time) starts once both are down: between the two
        # kills the cluster still has a quorum.
        t0 = tw = time.monotonic()
        self._sleep(self.rng.uniform(2.0, 4.0))
        t_restart = time.monotonic()
        self.c.start(a)
        self._window(tw, t_restart, None)
        self._sleep(self.rng.uniform(0.0, 1.0))
        self.c.start(b)
        self._emit("quorum", t0, [a, b], leader, "no_quorum")

    def _partition(self):
        leader = self._leader()
        variant = self.part_turn % 3
        self.part_turn += 1
        if variant == 2 and leader in self.c.voters:
            follower = self.rng.choice([i for i in self.c.voters if i != leader])
            t0 = time.monotonic()
            self.net.cut_one_way(leader, follower)
            self._sleep(self.rng.uniform(2.0, 5.0))
            self.net.heal()
            self._emit("partition", t0, [follower], None, "partitioned",
                       "one-way: node %d no longer hears node %d (the leader)" % (follower, leader))
            return
        if variant == 1 and leader in self.c.voters:
            nid, what = leader, "the leader cut off from both followers"
        else:
            nid, what = self.rng.choice(self.c.voters), "one node cut off"
        t0 = time.monotonic()
        self.net.isolate(nid)
        tw = time.monotonic()
        self._sleep(self.rng.uniform(2.0, 5.0))
        t1 = time.monotonic()
        self.net.heal()
        self._window(tw, t1, [nid])
        self._emit("partition", t0, [nid], leader, "partitioned", what)

    def _wipe(self):
        leader = self._leader()
        followers = [i for i in self.c.voters if i != leader]
        nid = self.rng.choice(followers)
        t0 = time.monotonic()
        self.c.kill(nid)
        self.c.wipe(nid)
        self._sleep(self.rng.uniform(0.5, 2.0))
        self.c.start(nid)
        self._emit("wipe", t0, [nid], leader, "one_down", "data directory deleted")

    def _membership(self):
        spare = max(self.c.nodes)
        node = self.c.nodes[spare]
        leader = self._leader()
        t0 = time.monotonic()
        self.c.wipe(spare)
        self.c.start(spare)

        def step(*args):
            return wait_until(lambda: (lambda r: r[0] == 0 and r[1] and
                                       r[1].get("outcome") == "ok")(self.c.ctl(*args)), 20, 0.3)

        done = []
        if step("members", "add", spare, node.raft, node.rpc, node.http):
            done.append("added")
            self._sleep(self.rng.uniform(0.5, 1.5))
            if step("members", "promote", spare):
                done.append("promoted")
                self._sleep(self.rng.uniform(1.0, 3.0))
        if done and step("members", "remove", spare):
            done.append("removed")
        self.c.kill(spare)
        self.c.wipe(spare)
        if done != ["added", "promoted", "removed"]:
            # The change did not go through under this run's faults: the event says so, and
            # it counts in the figures under its own name.
            self._emit("membership_failed", t0, [spare], leader, "membership",
                       "node %d: %s" % (spare, " then ".join(done) or "not added"))
            return
        self._emit("membership", t0, [spare], leader, "membership",
                   "node %d added, promoted, removed" % spare)

    def _powercut(self):
        leader = self._leader()
        nid = self.disk_node
        t0 = time.monotonic()
        # The node is frozen (SIGSTOP) first, so that no fsync it sees return is thrown away
        # by the cut, then the power goes, then SIGKILL; the disk comes back with only what
        # had been synced (powerdisk.PowerDisk.cut).
        self.c.expect_exit(nid)  # the cut kills it before self.c.kill does
        late = self.disk.cut(pids=[self.c.nodes[nid].proc.pid],
                             before_restore=lambda: self.c.kill(nid))
        self._sleep(self.rng.uniform(0.5, 2.0))
        self.c.start(nid)
        # A node that could not be frozen in time may have seen an fsync return that the cut
        # then dropped: the event says so (a loss after it would be the disk's, not idemd's).
        self._emit("powercut", t0, [nid], leader, "one_down",
                   "unsynced writes dropped, file system mounted again" +
                   ("; NOT FROZEN in time: %s" % late if late else ""))
