"""The Kubernetes manifests of tools/deploy/kubernetes/, without a Kubernetes: each file
parses, each object has apiVersion, kind and metadata.name, and they say what
docs/operations.md ("Running on Kubernetes") says they do: a StatefulSet of 3 started in
parallel behind a headless Service that publishes not-ready addresses, a client Service,
a PodDisruptionBudget of one, the probes on /livez and /readyz, non-root read-only
containers without capabilities, resources, a volume claim per pod. The ConfigMap's
idemd-config.sh is run as the init container runs it (its environment taken from the
StatefulSet) for pod idemd-1 in a temporary directory: the YAML it writes names node 2 and
the peers' DNS names, and passes `idemd --check-config` of this build.
Needs python3-yaml (tools/setup.sh --test).
Run: IDEM_BIN_DIR=build/bin python3 -m unittest -v test_kubernetes
"""
import glob
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import IDEMD  # noqa: E402

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "deploy",
                   "kubernetes")
API_VERSIONS = {"StatefulSet": "apps/v1", "Service": "v1", "ConfigMap": "v1", "Secret": "v1",
                "PodDisruptionBudget": "policy/v1", "NetworkPolicy": "networking.k8s.io/v1"}
LABELS = {"app.kubernetes.io/name": "idemd"}
PORTS = {"raft": 9001, "rpc": 7001, "http": 8001}
NAMESPACE = "payments"


def load_manifests():
    """{(kind, name): object} of every document of every .yaml file in DIR."""
    objects = {}
    for path in sorted(glob.glob(os.path.join(DIR, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is None:
                    continue
                key = (doc.get("kind"), (doc.get("metadata") or {}).get("name"))
                if key in objects:
                    raise AssertionError("%s: %s %s defined twice" % (path, key[0], key[1]))
                objects[key] = dict(doc, _file=os.path.basename(path))
    return objects


class TestKubernetes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = load_manifests()
        cls.sts = cls.objects[("StatefulSet", "idemd")]
        cls.pod = cls.sts["spec"]["template"]["spec"]
        cls.init = {c["name"]: c for c in cls.pod["initContainers"]}["config"]
        cls.idemd = {c["name"]: c for c in cls.pod["containers"]}["idemd"]
        cls.config_map = cls.objects[("ConfigMap", "idemd-config")]

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-k8s-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_every_object_is_named_and_known(self):
        self.assertEqual(sorted(f for f in os.listdir(DIR)),
                         sorted({o["_file"] for o in self.objects.values()}),
                         "a file of %s holds no manifest" % DIR)
        for (kind, name), obj in self.objects.items():
            self.assertIn(kind, API_VERSIONS, obj["_file"])
            self.assertEqual(obj["apiVersion"], API_VERSIONS[kind], obj["_file"])
            self.assertTrue(name, "%s: a %s without metadata.name" % (obj["_file"], kind))
            self.assertEqual(obj["metadata"].get("labels"), LABELS, name)
        self.assertEqual(sorted(self.objects), sorted([
            ("ConfigMap", "idemd-config"), ("NetworkPolicy", "idemd"),
            ("PodDisruptionBudget", "idemd"), ("Secret", "idemd-secrets"),
            ("Service", "idemd"), ("Service", "idemd-peers"), ("StatefulSet", "idemd")]))

    def test_statefulset_and_services(self):
        spec = self.sts["spec"]
        self.assertEqual(spec["replicas"], 3)
        self.assertEqual(spec["podManagementPolicy"], "Parallel")
        self.assertEqual(spec["selector"]["matchLabels"], LABELS)
        self.assertEqual(spec["template"]["metadata"]["labels"], LABELS)
        peers = self.objects[("Service", spec["serviceName"])]["spec"]
        self.assertEqual(spec["serviceName"], "idemd-peers")
        self.assertEqual(peers["clusterIP"], "None")
        self.assertIs(peers["publishNotReadyAddresses"], True)
        client = self.objects[("Service", "idemd")]["spec"]
        self.assertNotIn("clusterIP", client)  # a cluster IP of its own
        self.assertFalse(client.get("publishNotReadyAddresses", False))
        ports = {p["name"]: p["containerPort"] for p in self.idemd["ports"]}
        self.assertEqual(ports, PORTS)
        for svc, names in ((peers, ["raft", "rpc", "http"]), (client, ["rpc", "http"])):
            self.assertEqual(svc["selector"], LABELS)
            self.assertEqual([(p["name"], p["port"], p["targetPort"]) for p in svc["ports"]],
                             [(n, PORTS[n], n) for n in names])
        # The init container's environment agrees with the StatefulSet.
        env = {e["name"]: e for e in self.init["env"]}
        self.assertEqual(env["IDEM_PEER_SERVICE"]["value"], spec["serviceName"])
        self.assertEqual(int(env["IDEM_BOOTSTRAP_MEMBERS"]["value"]), spec["replicas"])
        self.assertEqual(env["IDEM_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.name")
        self.assertEqual(env["IDEM_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.namespace")

    def test_disruption_budget(self):
        pdb = self.objects[("PodDisruptionBudget", "idemd")]["spec"]
        self.assertEqual(pdb["maxUnavailable"], 1)
        self.assertNotIn("minAvailable", pdb)
        self.assertEqual(pdb["selector"]["matchLabels"], LABELS)

    def test_probes(self):
        c = self.idemd
        self.assertEqual(c["livenessProbe"]["httpGet"], {"path": "/livez", "port": "http"})
        self.assertEqual(c["startupProbe"]["httpGet"], {"path": "/livez", "port": "http"})
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "http"})

    def test_security_and_resources(self):
        ctx = self.pod["securityContext"]
        self.assertIs(ctx["runAsNonRoot"], True)
        self.assertNotEqual(ctx["runAsUser"], 0)
        self.assertIs(self.pod["automountServiceAccountToken"], False)
        for c in (self.init, self.idemd):
            sc = c["securityContext"]
            self.assertIs(sc["readOnlyRootFilesystem"], True, c["name"])
            self.assertIs(sc["allowPrivilegeEscalation"], False, c["name"])
            self.assertEqual(sc["capabilities"], {"drop": ["ALL"]}, c["name"])
            self.assertIn("memory", c["resources"]["limits"], c["name"])
            self.assertEqual(set(c["resources"]["requests"]), {"cpu", "memory"}, c["name"])
        # No CPU limit on idemd: throttling would stall its loop.
        self.assertNotIn("cpu", self.idemd["resources"]["limits"])

    def test_volumes(self):
        claims = {t["metadata"]["name"]: t["spec"]
                  for t in self.sts["spec"]["volumeClaimTemplates"]}
        self.assertEqual(list(claims), ["data"])
        self.assertEqual(claims["data"]["accessModes"], ["ReadWriteOnce"])
        self.assertIn("storage", claims["data"]["resources"]["requests"])
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        for c in (self.init, self.idemd):
            for m in c["volumeMounts"]:
                self.assertTrue(m["name"] in volumes or m["name"] in claims,
                                "%s mounts %s, which is no volume" % (c["name"], m["name"]))
        mounts = {m["name"]: m for m in self.idemd["volumeMounts"]}
        self.assertEqual(mounts["data"]["mountPath"], "/var/lib/idemd")
        self.assertEqual(volumes["config"]["configMap"]["name"], "idemd-config")
        self.assertIn(("Secret", volumes["secrets"]["secret"]["secretName"]), self.objects)
        self.assertEqual(volumes["run"]["emptyDir"]["medium"], "Memory")
        # The Secret template's placeholder is too short to be a Raft secret (32 bytes).
        secret = self.objects[("Secret", "idemd-secrets")]["stringData"]
        self.assertLess(len(secret["raft.secret"]), 32)

    def run_config_script(self, pod, **extra):
        """idemd-config.sh and idemd-base.yaml as the ConfigMap holds them, run with `sh`
        in the init container's environment (from the StatefulSet; the downward API's
        values made up) as pod POD, its paths moved into the temporary directory. Returns
        the process and the path of the YAML it writes."""
        data = self.config_map["data"]
        script = os.path.join(self.tmp, "idemd-config.sh")
        base = os.path.join(self.tmp, "idemd-base.yaml")
        admin, tenant = hashlib.sha256(b"admin").hexdigest(), hashlib.sha256(b"t").hexdigest()
        with open(script, "w") as f:
            f.write(data["idemd-config.sh"])
        with open(base, "w") as f:
            f.write(extra.pop("base", None) or data["idemd-base.yaml"]
                    .replace("REPLACE_WITH_THE_SHA256_OF_THE_ADMIN_TOKEN", admin)
                    .replace("REPLACE_WITH_THE_SHA256_OF_THE_TENANT_TOKEN", tenant))
        secrets = os.path.join(self.tmp, "secret")
        os.makedirs(secrets, exist_ok=True)
        secret = os.path.join(secrets, "raft.secret")
        if os.path.exists(secret):
            os.unlink(secret)
        with open(secret, "w") as f:
            f.write(extra.pop("raft_secret", "0123456789abcdef" * 4))
        os.chmod(secret, 0o440)  # as the Secret volume has it
        run = os.path.join(self.tmp, "run")
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM")}
        for e in self.init["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
        env.pop("IDEM_POD_NAME", None)
        env.update(HOSTNAME=pod, IDEM_NAMESPACE=NAMESPACE, IDEM_RUN_DIR=run,
                   IDEM_SECRET_DIR=secrets, IDEM_BASE_CONFIG=base, IDEMD=IDEMD)
        env.update(extra)
        self.assertEqual(self.init["command"][:2], ["sh", "/etc/idemd/config/idemd-config.sh"])
        p = subprocess.run(["sh", script], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        return p, os.path.join(run, "idemd.yaml")

    @staticmethod
    def host(n):
        return "idemd-%d.idemd-peers.%s.svc.cluster.local" % (n, NAMESPACE)

    def test_config_of_pod_1(self):
        p, out = self.run_config_script("idemd-1")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode(), "%s: ok (node 2, 1 tenant)\n" % out)
        with open(out) as f:
            cfg = yaml.safe_load(f)
        node = cfg["node"]
        self.assertEqual(node["id"], 2)
        for name, port in PORTS.items():
            self.assertEqual(node[name + "_address"], "%s:%d" % (self.host(1), port))
            self.assertEqual(node[name + "_listen"], "0.0.0.0:%d" % port)
        self.assertEqual(node["data_dir"], "/var/lib/idemd/data")
        mount = {m["name"]: m for m in self.idemd["volumeMounts"]}["data"]["mountPath"]
        self.assertTrue(node["data_dir"].startswith(mount + "/"))
        self.assertEqual(cfg["cluster"]["bootstrap"], [
            {"id": n + 1, "raft_address": "%s:9001" % self.host(n),
             "rpc_address": "%s:7001" % self.host(n), "http_address": "%s:8001" % self.host(n)}
            for n in range(3)])
        # The secret copied where the configuration names it, readable by its owner only.
        secret = cfg["raft"]["secret_file"]
        self.assertEqual(os.path.dirname(secret), os.path.dirname(out))
        self.assertEqual(stat.S_IMODE(os.stat(secret).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o600)
        # The idemd container runs the file the init container wrote, from the same volume.
        self.assertEqual(self.idemd["command"], ["idemd", "--config", "/run/idemd/idemd.yaml"])
        runs = [{m["name"]: m["mountPath"] for m in c["volumeMounts"]}.get("run")
                for c in (self.init, self.idemd)]
        self.assertEqual(runs, ["/run/idemd", "/run/idemd"])

    def test_config_of_a_pod_added_later(self):
        # Ordinal 3 (kubectl scale --replicas=4): node 4, no bootstrap list.
        p, out = self.run_config_script("idemd-3")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        with open(out) as f:
            cfg = yaml.safe_load(f)
        self.assertEqual(cfg["node"]["id"], 4)
        self.assertEqual(cfg["node"]["rpc_address"], "%s:7001" % self.host(3))
        self.assertNotIn("cluster", cfg)
        # A replaced node's new ID, through IDEM_NODE_IDS.
        p, out = self.run_config_script("idemd-1", IDEM_NODE_IDS="1 5 3",
                                        IDEM_BOOTSTRAP_MEMBERS="0")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        with open(out) as f:
            cfg = yaml.safe_load(f)
        self.assertEqual(cfg["node"]["id"], 5)
        self.assertNotIn("cluster", cfg)

    def test_config_refusals(self):
        # The placeholders of the shipped templates are refused: a pod does not start with them.
        p, _ = self.run_config_script("idemd-0", base=self.config_map["data"]["idemd-base.yaml"])
        self.assertEqual(p.returncode, 1)
        self.assertIn("token_sha256", p.stderr.decode())
        secret = self.objects[("Secret", "idemd-secrets")]["stringData"]["raft.secret"]
        p, _ = self.run_config_script("idemd-0", raft_secret=secret)
        self.assertEqual(p.returncode, 1)
        self.assertIn("raft.secret", p.stderr.decode())
        # A pod name without an ordinal; an ordinal IDEM_NODE_IDS has no ID for.
        p, _ = self.run_config_script("idemd")
        self.assertEqual(p.returncode, 1)
        self.assertIn("does not end in -ORDINAL", p.stderr.decode())
        p, _ = self.run_config_script("idemd-2", IDEM_NODE_IDS="1 2")
        self.assertEqual(p.returncode, 1)
        self.assertIn("names no node ID for ordinal 2", p.stderr.decode())


if __name__ == "__main__":
    unittest.main()
