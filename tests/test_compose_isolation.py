"""The compose networks keep workers away from the master's data (issue 26 §5).

docker-compose.yml is read as it is and its topology built on this machine
with network namespaces: one namespace per service (a service with
``network_mode: service:X`` shares X's), one bridge per compose network, a
veth from each service to each network it names. In each service that
serves something a listener takes its ports (what the images serve:
PostgreSQL 5432, Redis 6379, MinIO 9000/9001, web 8400). Then every service
tries every port of every other, at each of its addresses.

A worker (the ``worker`` service and the local ``fetcher``) must reach
web's port and nothing else, even routed through web (each worker's default
route points at web: web must not forward). The master's processes must
reach what they need — a topology that reached nothing would pass the first
check too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVES = {"postgres": [5432], "redis": [6379], "minio": [9000, 9001], "web": [8400]}
WORKERS = ("worker", "fetcher")
MASTER_SETTINGS = ("DATABASE_URL", "REDIS_URL", "FLEETHQ_SECRET_KEY", "FLEETHQ_SECRET_KEY_FILE")

LISTEN = """
import socket, sys, threading
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64); socks.append(s)
def serve(s):
    while True:
        c, _ = s.accept(); c.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def reach(target):
    try:
        socket.create_connection((target[0], target[1]), timeout=1.5).close()
        return True
    except OSError:
        return False
targets = json.loads(sys.argv[1])
with ThreadPoolExecutor(32) as pool:
    print(json.dumps([t for t, ok in zip(targets, pool.map(reach, targets)) if ok]))
"""


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Topology:
    """docker-compose.yml's services and networks as namespaces on this host."""

    def __init__(self, spec: dict):
        self.tag = f"fhq{os.getpid() % 100000}"
        services = spec["services"]
        self.ns = {}
        for name, service in services.items():
            mode = service.get("network_mode", "")
            self.ns[name] = f"{self.tag}-{mode.split(':', 1)[1] if mode.startswith('service:') else name}"
        self.networks = {name: (service.get("networks") or ["default"])
                         for name, service in services.items() if "network_mode" not in service}
        self.address: dict[tuple[str, str], str] = {}  # (service, network) -> address
        self.made: list[str] = []
        self.listeners: list[subprocess.Popen] = []

    def build(self) -> None:
        names = sorted({n for nets in self.networks.values() for n in nets})
        for k, network in enumerate(names):
            bridge_ns = f"{self.tag}-net{k}"
            self._netns(bridge_ns)
            ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
            ip("-n", bridge_ns, "link", "set", "br0", "up")
            for i, (service, nets) in enumerate(sorted(self.networks.items())):
                if network not in nets:
                    continue
                ns = self.ns[service]
                self._netns(ns)
                inside, outside = f"{self.tag}a{k}x{i}"[-15:], f"{self.tag}b{k}x{i}"[-15:]
                ip("link", "add", inside, "type", "veth", "peer", "name", outside)
                ip("link", "set", inside, "netns", ns)
                ip("link", "set", outside, "netns", bridge_ns)
                ip("-n", bridge_ns, "link", "set", outside, "master", "br0", "up")
                address = f"10.231.{k}.{i + 2}"
                ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
                ip("-n", ns, "link", "set", inside, "up")
                self.address[(service, network)] = address
        # The worst case for isolation: each worker routes everything through web.
        for worker in WORKERS:
            shared = [n for n in self.networks.get(worker, []) if n in self.networks.get("web", [])]
            if shared:
                ip("-n", self.ns[worker], "route", "add", "default", "via", self.address[("web", shared[0])])
        for service, ports in SERVES.items():
            self._listen(service, ports)

    def _netns(self, name: str) -> None:
        if name in self.made:
            return
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        # Containers do not forward between their networks.
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv4.ip_forward=0"],
                       check=True, timeout=30)

    def _listen(self, service: str, ports: list[int]) -> None:
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[service], sys.executable, "-c", LISTEN,
                                 *map(str, ports)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.listeners.append(proc)
        assert proc.stdout.readline().strip() == "ready", f"listener of {service} did not start"

    def reaches(self, service: str) -> set[tuple[str, int]]:
        """(service, port) pairs that ``service`` can open a connection to."""
        targets, owner = [], {}
        for (other, _network), address in self.address.items():
            if other == service or self.ns[other] == self.ns[service]:
                continue
            for port in SERVES.get(other, []):
                targets.append([address, port])
                owner[(address, port)] = other
        out = subprocess.run(["ip", "netns", "exec", self.ns[service], sys.executable, "-c", PROBE,
                              json.dumps(targets)], check=True, capture_output=True, text=True, timeout=60)
        return {(owner[(address, port)], port) for address, port in json.loads(out.stdout)}

    def close(self) -> None:
        for proc in self.listeners:
            proc.kill()
            proc.wait(timeout=10)
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def topology():
    built = Topology(compose())
    try:
        built.build()
        yield built
    finally:
        built.close()


@pytest.mark.parametrize("worker", WORKERS)
def test_a_worker_reaches_only_the_masters_http_port(topology, worker):
    assert topology.reaches(worker) == {("web", 8400)}


@pytest.mark.parametrize("service, needs", [
    ("web", {("postgres", 5432), ("redis", 6379), ("minio", 9000)}),
    ("tasks", {("postgres", 5432), ("redis", 6379), ("minio", 9000)}),
    ("consume", {("postgres", 5432), ("redis", 6379), ("minio", 9000)}),
    ("migrate", {("postgres", 5432)}),
    ("fetcher-node", {("postgres", 5432)}),
    ("minio-bucket", {("minio", 9000)}),
])
def test_the_masters_processes_reach_what_they_need(topology, service, needs):
    assert needs <= topology.reaches(service)


def test_the_data_services_have_no_way_out_and_the_workers_no_master_settings():
    spec = compose()
    networks = spec.get("networks") or {}
    for service in ("postgres", "redis", "minio"):
        nets = spec["services"][service].get("networks") or ["default"]
        assert all((networks.get(n) or {}).get("internal") for n in nets), (service, nets)
    for worker in WORKERS:
        service = spec["services"][worker]
        assert "network_mode" not in service and not service.get("secrets")
        env = service.get("environment") or {}
        assert not [k for k in env if k in MASTER_SETTINGS or k.startswith("S3_")], (worker, env)
