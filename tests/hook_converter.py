"""A converter as a separate process: answers every FleetHQ hook delivery
with 202 (accepted, not yet durable) and keeps the job only in memory.

    python tests/hook_converter.py --port 8123 --log events.jsonl [--call-back-when go.flag]

Every POST is appended to ``--log`` as a JSON line (``{"event": "post", ...}``).
Without ``--call-back-when`` it never calls back: killed, it loses the job,
which is the failure FleetHQ must survive. With it, it calls the delivery's
callback URL with its callback token once that file exists, and logs
``{"event": "callback", "status": ...}``. Duplicates of a delivery id are
coalesced: one callback per delivery.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--call-back-when")
    args = parser.parse_args()
    lock = threading.Lock()
    jobs: dict[str, dict] = {}

    def log(record: dict) -> None:
        with lock, open(args.log, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()

    def call_back(job: dict) -> None:
        while not os.path.exists(args.call_back_when):
            time.sleep(0.05)
        response = requests.post(job["callback_url"], timeout=30,
                                 headers={"Authorization": f"Bearer {job['callback_token']}"})
        log({"event": "callback", "delivery_id": job["delivery_id"], "status": response.status_code,
             "at": time.time()})

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            job = {k: payload[k] for k in ("delivery_id", "callback_url", "callback_token", "sha256")}
            log({"event": "post", "pid": os.getpid(), **job})
            with lock:
                first = job["delivery_id"] not in jobs
                jobs.setdefault(job["delivery_id"], job)
            self.send_response(202)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            if first and args.call_back_when:
                threading.Thread(target=call_back, args=(job,), daemon=True).start()

        def log_message(self, *args):
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    log({"event": "listening", "pid": os.getpid()})
    server.serve_forever()


if __name__ == "__main__":
    main()
