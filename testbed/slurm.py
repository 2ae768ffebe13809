"""A real Slurm cluster for tests: munge, slurmctld and slurmd on this machine, or one
slurmd in each node of an emulated cluster (``testbed.nodes``).

Everything lives in a temporary directory and reaches Slurm through ``SLURM_CONF``;
nothing is written to /etc. Daemons are stopped by PID.

    cluster = SlurmCluster.start()      # raises Unavailable with the reason
    cluster = SlurmCluster.start(nodes=emulated)   # NodeName = each node's hostname
    job_id = cluster.sbatch("slurm/train.sbatch", env=...)
    cluster.wait(job_id)
    cluster.stop()
"""

import glob
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.errors import Unavailable

# libpmix-dev: Slurm's PMIx plugin (`srun --mpi=pmix`, for Open MPI) opens the unversioned
# libpmix.so under pmix2/lib, which only the -dev package installs; without it the plugin
# fails to load in every slurmd.
PACKAGES = ["slurmd", "slurmctld", "slurm-client", "munge", "libpmix-dev"]
BINARIES = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue"]
LIBPMIX = "/usr/lib/*/pmix2/lib/libpmix.so"


def ensure_packages():
    if all(shutil.which(b) or os.path.exists(f"/usr/sbin/{b}") for b in BINARIES) \
            and glob.glob(LIBPMIX):
        return
    if os.geteuid() != 0:
        raise Unavailable("Slurm is not installed and installing it needs root: "
                          "apt-get install " + " ".join(PACKAGES))
    # Without recommends: the -dev plugin packages Debian recommends are of no use here.
    # `make test` may already be installing them in the background: wait for apt's lock.
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-qq",
               "--no-install-recommends", *PACKAGES]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-qq"],
                       capture_output=True)
        done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise Unavailable(f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr[-500:]}")


def _sbin(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


CONF = """\
ClusterName=hpcddp-test
FirstJobId={first_job}
SlurmctldHost={ctld_host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket},cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool.%n
TmpFS={dir}/tmp.%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
MessageTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=600
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{node_lines}
PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def _first_job_id():
    """Where this cluster's job ids start: not at 1 for every cluster. MPICH names its
    shared-memory segments after the PMI job (Slurm's job and step ids); a job killed
    before MPI_Finalize leaves them in /dev/shm, and the same ids in the next test
    cluster would attach to them (MPI_Init then fails with a truncated message)."""
    return random.randrange(1000, 60_000_000)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, directory: Path):
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    @classmethod
    def start(cls, cpus=None, nodes=None):
        """A single-node cluster on this host, or, with ``nodes`` (an ``EmulatedCluster``),
        one slurmd in each emulated node and slurmctld on the bridge's address."""
        if os.geteuid() != 0:
            raise Unavailable("the test cluster runs its daemons as root; run as root")
        ensure_packages()
        cluster = cls(Path(tempfile.mkdtemp(prefix="hpcddp-slurm-")))
        try:
            cluster._start(cpus or os.cpu_count(), nodes)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self, cpus, emulated):
        d = self.dir
        host = socket.gethostname()
        if emulated is None:
            names, ctld_host = [host], host
            node_lines = f"NodeName={host} CPUs={cpus} State=UNKNOWN"
        else:
            # slurmctld checks its own hostname against SlurmctldHost: it runs in a UTS
            # namespace of its own under this name, reached at the bridge's address.
            names = list(emulated.nodes)
            ctld_host = f"{emulated.name}-ctl({emulated.bridge_address})"
            node_lines = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN"
                                    for n, a in zip(emulated.nodes, emulated.addresses))
        # tmp.NODE is each node's TmpFS: the PMIx plugin makes a directory per step there
        # (spmix_appdir_UID_JOB.STEP), and in the one /tmp that the emulated nodes share,
        # every node but the first would fail to make it and the step would not start.
        for sub in ("state", "munge", *(f"{kind}.{n}" for n in names for kind in ("spool", "tmp"))):
            (d / sub).mkdir()
        os.chmod(d, 0o755)
        os.chmod(d / "munge", 0o755)  # munge refuses a socket directory others can write
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o600)
        sock = d / "munge" / "munge.socket"
        munged = subprocess.run(
            [_sbin("munged"), "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={d / 'munge' / 'munged.pid'}", f"--log-file={d / 'munge' / 'munged.log'}",
             f"--seed-file={d / 'munge' / 'munged.seed'}"], capture_output=True, text=True)
        if munged.returncode != 0:
            raise Unavailable(f"munged did not start: {munged.stderr.strip()}")
        self.conf.write_text(CONF.format(ctld_host=ctld_host, dir=d, munge_socket=sock,
                                         cpus=cpus, node_lines=node_lines,
                                         node_list=",".join(names),
                                         ctld_port=_free_port(), d_port=_free_port(),
                                         first_job=_first_job_id()))
        ctld = [_sbin("slurmctld"), "-D", "-f", str(self.conf)]
        daemons = {"slurmctld": ctld}
        if emulated is None:
            daemons["slurmd"] = [_sbin("slurmd"), "-D", "-f", str(self.conf)]
        else:
            daemons["slurmctld"] = ["unshare", "--uts", "sh", "-c",
                                    f"hostname {emulated.name}-ctl && exec {' '.join(ctld)}"]
            for node in names:  # nsenter, not ip netns exec: that hides /sys/fs/cgroup
                daemons[f"slurmd.{node}"] = emulated.node_command(
                    node, [_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", node])
        for daemon, argv in daemons.items():
            log = open(d / f"{daemon}.out", "w")
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               env=self.env, start_new_session=True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                                    text=True, env=self.env).stdout.split()
            state = " ".join(states)
            if len(states) == len(names) and \
                    all(s in ("idle", "mixed", "allocated") for s in states):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        logs = "\n".join(f"{f}: " + (d / f).read_text()[-1500:]
                         for f in (f"{daemon}.out" for daemon in daemons) if (d / f).exists())
        raise Unavailable(f"Slurm did not come up (node states {state!r}):\n{logs}")

    def run(self, *args, check=True):
        done = subprocess.run(list(args), capture_output=True, text=True, env=self.env)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, *args, env=None) -> int:
        environment = dict(self.env, **(env or {}))
        done = subprocess.run(["sbatch", "--parsable", *map(str, args)], capture_output=True,
                              text=True, env=environment)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id) -> dict:
        """``scontrol show job`` as a dictionary."""
        text = self.run("scontrol", "show", "job", str(job_id), check=False)
        fields = {}
        for token in text.split():
            key, _, value = token.partition("=")
            if _:
                fields.setdefault(key, value)
        return fields

    def wait(self, job_id, timeout=300, states=("COMPLETED", "FAILED", "CANCELLED",
                                                  "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState")
            if state in states:
                return self.job(job_id)
            time.sleep(0.5)
        state = self.job(job_id).get("JobState")
        # Cancelled, so that a stuck job does not hold its nodes from the tests after it.
        self.run("scancel", str(job_id), check=False)
        raise TimeoutError(f"job {job_id} still {state} after {timeout}s (cancelled)")

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        pid_file = self.dir / "munge" / "munged.pid"
        if pid_file.exists():
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, 15)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # munged writes its seed file on exit
                    os.kill(pid, 0)
                    time.sleep(0.1)
            except (OSError, ValueError):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
