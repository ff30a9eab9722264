"""A network lab for partition tests: each process in its own network namespace, the
namespaces joined by veth pairs to one bridge, partitions made by dropping packets
with iptables inside the namespaces (the way Jepsen cuts a network).

``NetLab.available()`` says why it cannot run (not root, no ``ip``/``iptables`` and no
way to install them); the tests then skip with that reason. Everything a lab makes
(processes, namespaces, veths, the bridge) is removed by ``close()``, which the
fixture always calls.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

from helpers.apt import ensure_packages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


def available() -> str | None:
    """None when namespaces and iptables can be used here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    # the project's own set-up: Debian's iptables package
    if not ensure_packages(["iptables"], lambda: shutil.which("iptables") is not None,
                           timeout_s=300):
        return "iptables is missing and could not be installed"
    probe = f"smqp{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-L", "-n")
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot make a network namespace with iptables here: {e}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


class Node:
    def __init__(self, name: str, ns: str, ip: str):
        self.name, self.ns, self.ip = name, ns, ip
        self.procs: list[subprocess.Popen] = []


class NetLab:
    def __init__(self, workdir: str):
        self.tag = uuid.uuid4().hex[:5]
        self.bridge = f"smqb{self.tag}"
        self.subnet = f"10.{77 + int(self.tag[:2], 16) % 100}.{int(self.tag[2:4], 16)}"
        self.workdir = workdir
        self.nodes: dict[str, Node] = {}
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)

    def node(self, name: str) -> Node:
        k = len(self.nodes) + 10
        ns, veth = f"smq{self.tag}{name}"[:15], f"smv{self.tag}{k}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        ip = f"{self.subnet}.{k}"
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        n = self.nodes[name] = Node(name, ns, ip)
        return n

    def spawn(self, node: Node, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(os.path.join(self.workdir, f"{node.name}-{len(node.procs)}.log"), "wb")
        p = subprocess.Popen(["ip", "netns", "exec", node.ns, sys.executable, *argv],
                             stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                             env={**os.environ, **(env or {})}, start_new_session=True)
        node.procs.append(p)
        return p

    # ------------------------------------------------------------ faults
    def cut(self, a: Node, b: Node) -> None:
        """Drop every packet between ``a`` and ``b``, both ways."""
        for x, y in ((a, b), (b, a)):
            _run("ip", "netns", "exec", x.ns, "iptables", "-A", "INPUT", "-s", y.ip, "-j",
                 "DROP")
            _run("ip", "netns", "exec", x.ns, "iptables", "-A", "OUTPUT", "-d", y.ip, "-j",
                 "DROP")

    def partition(self, *sides: list[Node]) -> None:
        for i, side in enumerate(sides):
            for other in sides[i + 1:]:
                for a in side:
                    for b in other:
                        self.cut(a, b)

    def heal(self) -> None:
        for n in self.nodes.values():
            _run("ip", "netns", "exec", n.ns, "iptables", "-F", check=False)

    def kill(self, node: Node, sig: int = signal.SIGKILL) -> None:
        for p in node.procs:
            if p.poll() is None:
                os.killpg(p.pid, sig)
        for p in node.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    # ------------------------------------------------------------ cleanup
    def close(self) -> None:
        for n in self.nodes.values():
            self.kill(n, signal.SIGKILL)
        for n in self.nodes.values():
            _run("ip", "netns", "del", n.ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)

    def wait(self, pred, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.2)
