"""Kubeflow's manifests run as Kubernetes would run their pods, with ddprun in place of torchrun.

Each pod is a network namespace on one bridge with its own host name (a UTS namespace), the
/etc/hosts a kubelet writes (localhost and the pod's own name) and an /etc/resolv.conf pointing at
the cluster's DNS with Kubernetes' search path and ndots:5. The DNS server (dnsmasq) starts only
after every pod has started and one of them has said it cannot resolve a peer: names resolve late,
as a pod's do until it is ready. Every pod gets exactly the environment the operator sets for the
manifest (Training Operator v1's PyTorchJob, static and elastic; Trainer v2's TrainJob on the
torch-distributed runtime), and runs the manifest's command with `ddprun` and the training script
replaced by the binaries under test. Every pod must exit 0 and every rank must have trained.

usage (root): kubeflow_pods.py DDPRUN WORKER_PY MANIFEST...   exits 77 where it cannot run (skip)
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

DOMAIN = "default.svc.cluster.local"
V1_PORT = "23456"       # the Training Operator's default port for PyTorchJob
TRAINER_PORT = "29400"  # Trainer v2's torch plugin
SKIP = 77


def pytorchjob_pods(doc):
    """(pod name, host name, DNS names, env, FQDN in /etc/hosts) of each pod of a v1 PyTorchJob, master first."""
    name, spec = doc["metadata"]["name"], doc["spec"]
    replicas = []
    for kind in ("Master", "Worker"):
        replicas += [f"{name}-{kind.lower()}-{i}" for i in range(spec["pytorchReplicaSpecs"].get(kind, {}).get("replicas", 0))]
    nproc, elastic = spec.get("nprocPerNode"), spec.get("elasticPolicy")
    pods = []
    for rank, pod in enumerate(replicas):
        env = {"PYTHONUNBUFFERED": "1"}
        if elastic:
            env.update(PET_RDZV_BACKEND=elastic.get("rdzvBackend", "c10d"),
                       PET_RDZV_ENDPOINT=f"{name}-worker-0:{V1_PORT}", PET_RDZV_ID=name,
                       PET_NNODES=f"{elastic['minReplicas']}:{elastic['maxReplicas']}",
                       PET_MAX_RESTARTS=str(elastic.get("maxRestarts", 0)),
                       PET_RDZV_CONF=",".join(f"{kv['key']}={kv['value']}" for kv in elastic.get("rdzvConf", [])))
        else:
            master = f"{name}-master-0"
            env.update(MASTER_ADDR=master, MASTER_PORT=V1_PORT, WORLD_SIZE=str(len(replicas)), RANK=str(rank))
            if nproc:
                env.update(PET_NNODES=str(len(replicas)), PET_NODE_RANK=str(rank), PET_MASTER_ADDR=master,
                           PET_MASTER_PORT=V1_PORT)
        if nproc:
            env["PET_NPROC_PER_NODE"] = str(nproc)
        # A headless Service per pod, named as the pod; no subdomain.
        pods.append((pod, pod, [f"{pod}.{DOMAIN}"], env, None))
    return pods


def trainjob_pods(doc):
    """The pods of a v2 TrainJob on the torch-distributed runtime (a JobSet of one replicated job)."""
    name, trainer = doc["metadata"]["name"], doc["spec"]["trainer"]
    pods = []
    for index in range(trainer["numNodes"]):
        host = f"{name}-node-0-{index}"
        env = {"PYTHONUNBUFFERED": "1", "PET_NNODES": str(trainer["numNodes"]),
               "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", 1)), "PET_NODE_RANK": str(index),
               "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": TRAINER_PORT,
               "JOB_COMPLETION_INDEX": str(index)}
        # The JobSet's pods have hostname and subdomain: the kubelet names the FQDN in /etc/hosts.
        pods.append((host, host, [f"{host}.{name}.{DOMAIN}"], env, f"{host}.{name}.{DOMAIN}"))
    return pods


def command_of(doc):
    if doc["kind"] == "TrainJob":
        return doc["spec"]["trainer"]["command"]
    spec = doc["spec"]["pytorchReplicaSpecs"]
    return next(iter(spec.values()))["template"]["spec"]["containers"][0]["command"]


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, text=True)


class Cluster:
    def __init__(self, work, tag):
        self.work, self.tag, self.sw = work, tag, f"k8s{tag}sw"
        self.namespaces, self.procs, self.dns = [], [], None
        sh("ip", "netns", "add", self.sw)
        self.namespaces.append(self.sw)
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "addr", "add", "10.78.0.1/24", "dev", "br0")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")

    def add_pod(self, i, host, fqdn):
        ns, addr = f"k8s{self.tag}p{i}", f"10.78.0.{10 + i}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "add", f"k{self.tag}h{i}", "netns", ns, "type", "veth", "peer", "name", f"k{self.tag}b{i}",
           "netns", self.sw)
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", f"k{self.tag}h{i}")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", f"k{self.tag}h{i}", "up")
        sh("ip", "-n", self.sw, "link", "set", f"k{self.tag}b{i}", "master", "br0", "up")
        hosts = os.path.join(self.work, f"hosts.{i}")
        with open(hosts, "w") as f:  # what a kubelet writes: localhost and the pod itself
            f.write(f"127.0.0.1 localhost\n{addr} {fqdn + ' ' if fqdn else ''}{host}\n")
        return ns, addr, hosts

    def start_pod(self, ns, host, hosts, argv, env, log):
        resolv = os.path.join(self.work, "resolv.conf")
        with open(resolv, "w") as f:
            f.write(f"search {DOMAIN} svc.cluster.local cluster.local\nnameserver 10.78.0.1\noptions ndots:5\n")
        script = ('hostname "$0" && mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && '
                  'shift 2 && exec "$@"')
        out = open(log, "w")
        p = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--", "bash",
                              "-c", script, host, hosts, resolv, *argv], env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def start_dns(self, records):
        args = ["nsenter", f"--net=/run/netns/{self.sw}", "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
                "--no-resolv", "--no-hosts", "--no-poll", "--bind-interfaces", "--listen-address=10.78.0.1",
                "--user=root", "--log-facility=-", "--pid-file=" + os.path.join(self.work, "dnsmasq.pid")]
        args += [f"--host-record={name},{addr}" for name, addr in records]
        self.dns = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self):
        for p in self.procs + ([self.dns] if self.dns else []):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
                p.wait()
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_manifest(path, ddprun, worker, tag):
    with open(path) as f:
        doc = yaml.safe_load(f)
    pods = trainjob_pods(doc) if doc["kind"] == "TrainJob" else pytorchjob_pods(doc)
    command = command_of(doc)
    assert command[0] == "ddprun", f"{path}: the command starts with ddprun, not {command[0]}"
    argv = [ddprun, *[worker if a.endswith(".py") else a for a in command[1:]]]
    work = tempfile.mkdtemp(prefix=f"kubeflow-{doc['metadata']['name']}-")
    cluster = Cluster(work, tag)
    failures = []
    try:
        base = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "PYTHON_EXEC": sys.executable,
                "DDPRUN_PROGRESS_INTERVAL": "1",
                # An empty variable, as some operator versions leave it, reads as unset.
                "PET_STANDALONE": ""}
        started, records = [], []
        for i, (pod, host, names, env, fqdn) in enumerate(pods):
            ns, addr, hosts = cluster.add_pod(i, host, fqdn)
            records += [(name, addr) for name in names]
            log = os.path.join(work, f"{pod}.log")
            started.append((pod, cluster.start_pod(ns, host, hosts, argv, {**base, **env}, log), log))
        # The cluster's DNS answers only once some pod has had to wait for it.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("cannot resolve host" in open(log).read() for _, _, log in started):
            time.sleep(0.2)
        waited = any("cannot resolve host" in open(log).read() for _, _, log in started)
        cluster.start_dns(records)
        world = 0
        for pod, p, log in started:
            try:
                code = p.wait(timeout=240)
            except subprocess.TimeoutExpired:
                code = "timeout"
            text = open(log).read()
            if code != 0:
                failures.append(f"{pod}: exit {code}\n{text[-4000:]}")
            world += text.count(" ok ")
        if not waited:
            failures.append("no pod waited for a name to resolve (the DNS was meant to answer late)")
        ranks = sum(int(env.get("PET_NPROC_PER_NODE", "1")) for _, _, _, env, _ in pods)
        if not failures and world < ranks:
            failures.append(f"{world} of {ranks} ranks reported their collectives right")
        return failures
    finally:
        cluster.close()
        if failures:
            print(f"(logs kept in {work})", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    ddprun, worker, manifests = os.path.abspath(argv[0]), os.path.abspath(argv[1]), argv[2:]
    if os.geteuid() != 0:
        print("SKIP: needs root (network, UTS and mount namespaces)")
        return SKIP
    for tool in ("dnsmasq", "nsenter", "unshare", "ip"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            print(f"SKIP: {tool} is missing (scripts/install_deps.sh installs it)")
            return SKIP
    if subprocess.run(["ip", "netns", "add", f"k8s{os.getpid()}probe"], capture_output=True).returncode != 0:
        print("SKIP: cannot create network namespaces here")
        return SKIP
    subprocess.run(["ip", "netns", "del", f"k8s{os.getpid()}probe"], capture_output=True)
    status = 0
    for n, manifest in enumerate(manifests):
        failures = run_manifest(manifest, ddprun, worker, f"{os.getpid() % 10000}{n}")
        print(f"{'ok' if not failures else 'FAILED'}: {os.path.basename(manifest)}")
        for f in failures:
            print(f)
        status |= 1 if failures else 0
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
