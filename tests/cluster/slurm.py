"""A real SLURM cluster on this machine for the tests: ``munged``, ``slurmctld`` and one ``slurmd`` per simulated node,
each node in a network namespace of its own, so that Ray started by ``srun`` sees one address per node as on a lab's
cluster (``ray start --address`` refuses a second node on one machine while Ray stays on the loopback interface).

Network: a bridge in the root namespace (``slurmctld`` listens on its address; the tests' MLflow server too), one
namespace per node joined to it by a veth pair, one address per node in a /24 no interface of the machine uses.
``slurmd -N nX`` is started with ``nsenter --net=/run/netns/NAME`` (``ip netns exec`` remounts /sys, and slurmd then
finds no cgroup filesystem). Every daemon and client command reads the cluster's own ``slurm.conf`` through
``SLURM_CONF`` (never the machine's /etc/slurm) and its own ``munged`` through ``AuthInfo=socket=...``; each node has
its own port, spool and log. ``stop`` cancels the cluster's jobs, stops exactly the daemons it started by PID, and
deletes exactly the namespaces and links it created and the Ray folders its jobs left (all named after it). Needs
root (namespaces, SLURM's ``SlurmUser=root``), ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them);
``slurm_missing`` says what is missing.

Reuse: the session's ``slurm_cluster`` fixture (``tests/cluster/conftest.py``: three one-CPU nodes) and
``slurm_tracking`` (an MLflow server on the bridge, its sqlite store readable by the test). A test submits with
``SlurmCluster.sbatch`` (the job id), follows it with ``job`` / ``job_state`` / ``wait_for_job``, and runs any client
command (``scontrol requeue``, ``scancel --signal``) with ``command``; ``nodes`` maps node names to their addresses.
``start_slurm_cluster(node_count, cpus)`` builds another (a module of its own, other partitions: edit
``_write_conf``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMON_START_S = 30
PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "munged": "munge"}


def slurm_missing() -> str | None:
    """Why a SLURM cluster cannot start here, or None: the tests skip, naming the missing package or right."""
    for command, package in PACKAGES.items():
        if shutil.which(command) is None and not Path("/usr/sbin", command).is_file():
            return f"{command} is not installed (Debian package {package}; .ci/run installs it)"
    for command in ("ip", "nsenter"):
        if shutil.which(command) is None:
            return f"{command} is not installed (iproute2 / util-linux): the SLURM nodes need network namespaces"
    if os.geteuid() != 0:
        return "the SLURM tests need root: one network namespace per node, slurmd and slurmctld as SlurmUser=root"
    return None


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _free_subnet() -> str:
    """``10.213.N`` (a /24) that no address or route of the machine is in."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for third in random.sample(range(1, 255), 254):
        if f"10.213.{third}." not in used:
            return f"10.213.{third}"
    raise RuntimeError("no free 10.213.N.0/24 for the SLURM test nodes")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    """The running cluster: ``nodes`` maps each node's name to its address; ``bridge_ip`` is the controller's."""

    home: Path
    tag: str
    bridge_ip: str = ""
    nodes: dict[str, str] = field(default_factory=dict)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)  # the bridge and the veth ends in the root namespace
    namespaces: list[str] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.home / "slurm.conf"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default this process's environment) with the cluster's ``SLURM_CONF``."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """A SLURM client command (sbatch, squeue, scontrol, scancel, srun) against this cluster."""
        done = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def sbatch(self, *args: str, cwd: Path, env: dict[str, str]) -> int:
        """``sbatch --parsable ARGS`` from ``cwd`` with ``env`` (plus ``SLURM_CONF``); the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *args], cwd=cwd, env=self.env(env), capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, NodeList, Restarts, ...)."""
        shown = self.command("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def job_state(self, job_id: int) -> str:
        return self.job(job_id)["JobState"]

    def wait_for_job(self, job_id: int, states: set[str], timeout_s: float) -> str:
        """Until the job is in one of ``states``; its state, or AssertionError naming the last one."""
        deadline = time.monotonic() + timeout_s
        while (state := self.job_state(job_id)) not in states:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {state} after {timeout_s:.0f} s, not one of {states}")
            time.sleep(1)
        return state

    def start(self, node_count: int, cpus: int) -> None:
        self._network(node_count)
        self._munge()
        self._write_conf(cpus)
        self._spawn("slurmctld", [_daemon("slurmctld"), "-D", "-i"])
        self._wait_for_log(self.home / "slurmctld.log", "Running as primary controller")
        for name in self.nodes:
            netns = f"/run/netns/{self.tag}-{name}"
            self._spawn(f"slurmd-{name}", ["nsenter", f"--net={netns}", _daemon("slurmd"), "-D", "-N", name])
        deadline = time.monotonic() + DAEMON_START_S
        while True:
            idle = self.command("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()
            if len(idle) == node_count:
                return
            for name, process in self.daemons.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} ended ({process.returncode}): {self._logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {idle} of {list(self.nodes)} idle after {DAEMON_START_S} s: {self._logs()}")
            time.sleep(0.5)

    def _network(self, node_count: int) -> None:
        subnet = _free_subnet()
        self.bridge_ip = f"{subnet}.1"
        bridge = f"{self.tag}br"
        _ip("link", "add", bridge, "type", "bridge")
        self.links.append(bridge)
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for index in range(1, node_count + 1):
            name, netns, outer, inner = (
                f"n{index}",
                f"{self.tag}-n{index}",
                f"{self.tag}h{index}",
                f"{self.tag}p{index}",
            )
            _ip("netns", "add", netns)
            self.namespaces.append(netns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self.links.append(outer)
            _ip("link", "set", inner, "netns", netns)
            _ip("link", "set", outer, "master", bridge, "up")
            address = f"{subnet}.{10 + index}"
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", netns, "link", "set", inner, "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            self.nodes[name] = address

    def _munge(self) -> None:
        key = self.home / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                _daemon("munged"),
                "-F",
                "--force",
                f"--socket={self.home / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={self.home / 'munged.pid'}",
                f"--log-file={self.home / 'munged.log'}",
                f"--seed-file={self.home / 'munged.seed'}",
            ],
        )
        deadline = time.monotonic() + DAEMON_START_S
        while not (self.home / "munge.socket").exists():
            if self.daemons["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._logs()}")
            time.sleep(0.1)

    def _write_conf(self, cpus: int) -> None:
        host = socket.gethostname()
        lines = [
            f"ClusterName={self.tag}",
            f"SlurmctldHost={host}({self.bridge_ip})",
            f"SlurmctldPort={_free_port(self.bridge_ip)}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: a requeued job waits this + 1 s before it may start again (SLURM default: 120)
            f"AuthInfo=socket={self.home / 'munge.socket'},cred_expire=30",
            f"StateSaveLocation={self.home / 'state'}",
            f"SlurmdSpoolDir={self.home / 'spool'}/%n",
            f"SlurmctldPidFile={self.home / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.home / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.home / 'slurmctld.log'}",
            f"SlurmdLogFile={self.home / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",  # no cgroups needed; SLURM signals every process of a step
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",  # the nodes' CPUs as declared here, whatever the machine has
            "ReturnToService=2",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "JobRequeue=1",
            "KillWait=10",  # SIGTERM, then SIGKILL 10 s later (sites: 30 s, the default)
            "MinJobAge=3600",  # a finished job stays in `scontrol show job` for the test to read
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "SchedulerParameters=sched_interval=5,bf_interval=5",  # a requeued job starts within seconds of eligible
        ]
        (self.home / "state").mkdir()
        for name, address in self.nodes.items():
            (self.home / "spool" / name).mkdir(parents=True)
            port = _free_port(self.bridge_ip)
            lines.append(
                f"NodeName={name} NodeAddr={address} NodeHostname={host} Port={port} CPUs={cpus} State=UNKNOWN"
            )
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.home / f"{name}.out").open("w")
        self.daemons[name] = subprocess.Popen(
            command,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _wait_for_log(self, log: Path, line: str) -> None:
        deadline = time.monotonic() + DAEMON_START_S
        while not (log.exists() and line in log.read_text(errors="replace")):
            if any(p.poll() is not None for p in self.daemons.values()) or time.monotonic() > deadline:
                raise RuntimeError(f"{log.name}: no {line!r}: {self._logs()}")
            time.sleep(0.2)

    def _logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}"
            for path in sorted(self.home.glob("*.log")) + sorted(self.home.glob("*.out"))
        )

    def stop(self) -> None:
        """Cancel the cluster's jobs and wait for them to end, then stop the daemons by PID (slurmd first, munged
        last) and delete the namespaces and links this cluster created, by name."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.command("scancel", "--full", *self.job_ids(), check=False)
                deadline = time.monotonic() + 60
                while self.command("squeue", "-h", "-o", "%i", check=False).stdout.strip():
                    if time.monotonic() > deadline:
                        break
                    time.sleep(1)
        order = [n for n in self.daemons if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            process = self.daemons.get(name)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for netns in self.namespaces:  # deleting a namespace deletes the veth end inside it, and with it its peer
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        for link in self.links:
            if Path(f"/sys/class/net/{link}").exists():
                subprocess.run(["ip", "link", "delete", link], capture_output=True)
        for ray_dir in Path("/tmp").glob(f"ray-{self.tag}-*"):  # a job's node folders (ray_node.sh), if one was killed
            shutil.rmtree(ray_dir, ignore_errors=True)

    def job_ids(self) -> list[str]:
        return self.command("squeue", "-h", "-o", "%i", check=False).stdout.split()


def start_slurm_cluster(node_count: int = 3, cpus: int = 1) -> SlurmCluster:
    """A cluster of ``node_count`` nodes of ``cpus`` CPUs each in a new folder under /tmp (the nodes and the test
    share it); stopped and removed with ``stop_slurm_cluster``."""
    home = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    cluster = SlurmCluster(home, f"sl{os.getpid() % 100000}")
    try:
        cluster.start(node_count, cpus)
    except BaseException:
        stop_slurm_cluster(cluster)
        raise
    return cluster


def stop_slurm_cluster(cluster: SlurmCluster) -> None:
    try:
        cluster.stop()
    finally:
        shutil.rmtree(cluster.home, ignore_errors=True)


if __name__ == "__main__":  # a manual try: start, print the nodes, wait for Enter, stop
    started = start_slurm_cluster(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print(f"SLURM_CONF={started.conf}", started.nodes, flush=True)
    try:
        input()
    finally:
        stop_slurm_cluster(started)
