"""fleethq-worker without a master: the volume lock, startup checks of the
journal and ready files, the journal's atomic writes, settings, and the
master client's rules (HTTPS unless allowed, no redirects with the token,
1 MiB upload reads). The runner runs as a subprocess where exit codes and
messages are what is tested."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.runner import EXIT_CORRUPT, EXIT_LOCKED, EXIT_USAGE
from workers.runner.journal import Journal
from workers.runner.master import UPLOAD_BLOCK, BlockReader, Master, MasterError
from workers.runner.settings import resolve
from workers.runner.volume import Identity, Volume, VolumeCorrupt

ROOT = Path(__file__).resolve().parent.parent


def run_cli(volume: Path, *extra: str, timeout: float = 30,
            master: str = "http://127.0.0.1:9") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")}
    return subprocess.run([sys.executable, "-m", "workers.runner.cli", "run", "--master", master,
                           "--volume", str(volume), "--project", "p", "--allow-http", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def enrolled_volume(path: Path) -> Identity:
    """A volume whose identity is registered: startup needs no master until approval."""
    volume = Volume(path)
    volume.open()
    identity = Identity.generate("test", "http://127.0.0.1:9")
    identity.registered = True
    volume.save_identity(identity)
    volume.close()
    return identity


def ready_entry(journal: Journal, volume: Path, attempt: str, data: bytes) -> None:
    (volume / "ready" / f"{attempt}.pdf").write_bytes(data)
    journal.add({"attempt_id": attempt, "job_id": "1", "project": "p", "value": "10.1/x",
                 "state": "downloading"})
    journal.update(attempt, state="ready", file=f"{attempt}.pdf",
                   sha256=hashlib.sha256(data).hexdigest(), size=len(data), ready_at=time.time())


# ------------------------------------------------------------- the volume


def test_second_runner_on_a_volume_exits_with_the_lock_message(tmp_path):
    enrolled_volume(tmp_path / "v")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")}
    # The first runner waits for an unreachable master, holding the lock.
    first = subprocess.Popen([sys.executable, "-m", "workers.runner.cli", "run", "--master",
                              "http://127.0.0.1:9", "--volume", str(tmp_path / "v"), "--project", "p",
                              "--allow-http"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while (tmp_path / "v" / "lock").read_bytes().strip() != str(first.pid).encode() \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        second = run_cli(tmp_path / "v")
        assert second.returncode == EXIT_LOCKED, second.stderr
        assert "is in use by another fleethq-worker" in second.stderr
        assert f"pid {first.pid}" in second.stderr
    finally:
        first.terminate()
        first.wait(20)
    assert first.returncode == 0  # SIGTERM while waiting: a clean stop


def test_corrupt_journal_stops_startup_with_a_clear_message(tmp_path):
    enrolled_volume(tmp_path / "v")
    (tmp_path / "v" / "journal.json").write_text('{"version": 1, "entries": {"12": ')
    result = run_cli(tmp_path / "v")
    assert result.returncode == EXIT_CORRUPT, result.stderr
    assert "results journal" in result.stderr and "is corrupt" in result.stderr


def test_ready_file_with_another_hash_stops_startup(tmp_path):
    identity = enrolled_volume(tmp_path / "v")
    journal = Journal(tmp_path / "v" / "journal.json", identity.worker_id)
    ready_entry(journal, tmp_path / "v", "41", b"%PDF-1.4 original %%EOF")
    (tmp_path / "v" / "ready" / "41.pdf").write_bytes(b"%PDF-1.4 tampered %%EOF")
    result = run_cli(tmp_path / "v")
    assert result.returncode == EXIT_CORRUPT, result.stderr
    assert "ready file" in result.stderr and "differs from the journal" in result.stderr
    assert (tmp_path / "v" / "ready" / "41.pdf").exists()  # never deleted on a mismatch


def test_missing_ready_file_stops_startup(tmp_path):
    identity = enrolled_volume(tmp_path / "v")
    journal = Journal(tmp_path / "v" / "journal.json", identity.worker_id)
    ready_entry(journal, tmp_path / "v", "42", b"%PDF-1.4 x %%EOF")
    (tmp_path / "v" / "ready" / "42.pdf").unlink()
    result = run_cli(tmp_path / "v")
    assert result.returncode == EXIT_CORRUPT and "is missing" in result.stderr


def test_journal_of_another_identity_is_refused(tmp_path):
    enrolled_volume(tmp_path / "v")
    Journal(tmp_path / "v" / "journal.json", "someone-else-entirely").flush()
    with pytest.raises(VolumeCorrupt, match="belongs to worker"):
        Journal.load(tmp_path / "v" / "journal.json", "this-worker-identity-x")


def test_no_identity_and_no_credential_is_an_enrollment_error(tmp_path):
    result = run_cli(tmp_path / "fresh")
    assert result.returncode == 6 and "pass --enroll" in result.stderr


def test_identity_file_is_private_and_written_before_registering(tmp_path):
    # The master is unreachable: registration retries, the identity is on disk.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")}
    proc = subprocess.Popen([sys.executable, "-m", "workers.runner.cli", "run", "--master",
                             "http://127.0.0.1:9", "--volume", str(tmp_path / "v"), "--project", "p",
                             "--allow-http", "--enroll", "fhqe_test"], cwd=ROOT, env=env,
                            stderr=subprocess.DEVNULL)
    try:
        path = tmp_path / "v" / "identity.json"
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        first = json.loads(path.read_text())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert first["registered"] is False and first["secret"].startswith("fhqn_")
        assert 16 <= len(first["worker_id"]) <= 128
    finally:
        proc.terminate()
        proc.wait(20)
    # A restart keeps the same identity for the retried registration.
    assert json.loads(path.read_text())["worker_id"] == first["worker_id"]


# ------------------------------------------------------------- the journal


def test_journal_round_trip_and_atomic_replace(tmp_path):
    journal = Journal(tmp_path / "journal.json", "w" * 20)
    journal.add({"attempt_id": "7", "job_id": "3", "project": "p", "value": "10.1/a",
                 "state": "downloading"})
    journal.update("7", state="failed", reported=False, error={"code": "network", "message": "x"})
    again = Journal.load(tmp_path / "journal.json", "w" * 20)
    assert again.get("7")["state"] == "failed" and again.get("7")["error"]["code"] == "network"
    assert stat.S_IMODE((tmp_path / "journal.json").stat().st_mode) == 0o600


def test_journal_group_commit_from_many_threads(tmp_path):
    journal = Journal(tmp_path / "journal.json", "w" * 20)
    def writer(i):
        journal.add({"attempt_id": str(i), "job_id": str(i), "project": "p", "value": "v",
                     "state": "downloading"})
        journal.update(str(i), state="failed", reported=False, error={"code": "timeout", "message": ""})
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loaded = Journal.load(tmp_path / "journal.json", "w" * 20)
    assert len(loaded.entries("failed")) == 40


def test_journal_rejects_a_ready_entry_without_its_hash(tmp_path):
    (tmp_path / "journal.json").write_text(json.dumps({"version": 1, "worker_id": "w" * 20, "entries": {
        "5": {"attempt_id": "5", "job_id": "1", "project": "p", "value": "v", "state": "ready",
              "created_at": 1, "updated_at": 1, "file": "5.pdf"}}}))
    with pytest.raises(VolumeCorrupt, match="without 'sha256'"):
        Journal.load(tmp_path / "journal.json", "w" * 20)


# ------------------------------------------------------------- settings and HTTP


def test_settings_from_environment_and_flags(tmp_path):
    import argparse

    from workers.runner.settings import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"FLEETHQ_MASTER": "https://hq.example.org", "FLEETHQ_VOLUME": str(tmp_path),
           "FLEETHQ_PROJECTS": "a, b", "FLEETHQ_CONCURRENCY": "3",
           "FLEETHQ_FETCH_ALLOW_NETWORKS": "127.0.0.2/32"}
    settings = resolve(parser.parse_args(["--concurrency", "5"]), env)
    assert (settings.projects, settings.concurrency, settings.allow_networks) == (
        ["a", "b"], 5, ["127.0.0.2/32"])
    with pytest.raises(ValueError, match="FLEETHQ_FETCH_ALLOW_NETWORKS"):
        resolve(parser.parse_args([]), {**env, "FLEETHQ_FETCH_ALLOW_NETWORKS": "not-a-net"})


def test_plain_http_master_needs_allow_http(tmp_path):
    result = subprocess.run([sys.executable, "-m", "workers.runner.cli", "run", "--master",
                             "http://hq.example.org", "--volume", str(tmp_path), "--project", "p"],
                            cwd=ROOT, capture_output=True, text=True, timeout=30,
                            env={k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")})
    assert result.returncode == EXIT_USAGE and "refusing plain http" in result.stderr


def test_redirects_from_the_master_are_not_followed_with_the_token():
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/api/"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{server.server_port}/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        master = Master(f"http://127.0.0.1:{server.server_port}", client_version="t",
                        allow_http=True, secret="fhqn_secret")
        with pytest.raises(MasterError) as caught:
            master.call("GET", "/api/v1/fleet/status")
        assert caught.value.code == "redirect" and "not followed" in caught.value.message
    finally:
        server.shutdown()
    assert seen == [("/api/v1/fleet/status", "Bearer fhqn_secret")]


def test_upload_body_is_read_in_one_mebibyte_blocks(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(3 * UPLOAD_BLOCK + 5))
    with open(path, "rb") as f:
        reader = BlockReader(f, path.stat().st_size)
        assert len(reader) == 3 * UPLOAD_BLOCK + 5
        sizes = [len(reader.read(8192)) for _ in range(4)]
    assert sizes == [UPLOAD_BLOCK, UPLOAD_BLOCK, UPLOAD_BLOCK, 5]
