"""A small TCP round-robin proxy: each new client connection goes to the next
backend that accepts it (a backend refusing connections is skipped). It stands
in for the load balancer in front of several web instances in tests and in
``bench/scaleout.py``; it runs as its own process so that its CPU is not taken
from whoever drives the traffic.

    python -m tests.roundrobin_proxy --port 8500 127.0.0.1:8401 127.0.0.1:8402

It prints ``listening <port>`` once it accepts connections, and on SIGUSR1 a
line ``served <backend>=<connections> …``.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import subprocess
import sys
import time

CHUNK = 256 * 1024


class Proxy:
    def __init__(self, backends: list[tuple[str, int]]):
        self.backends = backends
        self.turn = itertools.cycle(range(len(backends)))
        self.served = [0] * len(backends)

    async def _pipe(self, reader, writer):
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.write_eof()
            except (OSError, RuntimeError):
                writer.close()

    async def handle(self, client_reader, client_writer):
        for _ in range(len(self.backends)):
            index = next(self.turn)
            try:
                backend_reader, backend_writer = await asyncio.open_connection(*self.backends[index])
                break
            except OSError:
                continue
        else:
            client_writer.close()
            return
        self.served[index] += 1
        await asyncio.gather(self._pipe(client_reader, backend_writer),
                             self._pipe(backend_reader, client_writer))
        for writer in (backend_writer, client_writer):
            writer.close()

    def report(self) -> str:
        return "served " + " ".join(f"{h}:{p}={n}" for (h, p), n in zip(self.backends, self.served))


async def serve(port: int, backends: list[tuple[str, int]]) -> None:
    proxy = Proxy(backends)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port, backlog=512)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(proxy.report(), flush=True))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("backends", nargs="+", help="host:port")
    args = parser.parse_args()
    backends = [(b.rsplit(":", 1)[0], int(b.rsplit(":", 1)[1])) for b in args.backends]
    asyncio.run(serve(args.port, backends))


class ProxyProcess:
    """Start the proxy as a child process and wait until it listens."""

    def __init__(self, port: int, backend_urls: list[str], cwd: str):
        hosts = [u.removeprefix("http://") for u in backend_urls]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.roundrobin_proxy", "--port",
                                      str(port), *hosts], cwd=cwd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening"):
            self.stop()
            raise RuntimeError(f"the proxy did not start: {line!r}")

    def served(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("served"):
                return {k: int(v) for k, v in (item.rsplit("=", 1) for item in line.split()[1:])}
        raise RuntimeError("the proxy did not report")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    main()
