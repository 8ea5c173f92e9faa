"""The running worker: threads around one journal (DESIGN §9).

    heartbeat   every ``heartbeat_s``: capacity, browser health, disk and spool,
                last error, running attempts; cancels attempts the master no
                longer lists (claiming.py holds the claim loop)
    claim       fills free fetch slots from the configured projects
    fetch ×N    one daemon thread per slot (``concurrency``): the ladder's HTTP pass
    browser ×B  the browser pass for jobs that need it (``browser_concurrency``)
    delivery    a dispatcher, N upload threads and 2N receipt waiters, delivery.py

Every thread is a daemon: stopping never waits for a fetch or an upload to
end. That is safe because everything that matters is in the journal; the next
start resumes from there (recovery.py, :meth:`Runner.resume`).
"""
from __future__ import annotations

import logging
import queue
import threading
import time

from workers.runner.claiming import Claimer
from workers.runner.delivery import Delivery
from workers.runner.fetching import NEEDS_BROWSER, Fetcher, fetch_configs
from workers.runner.fitness import Fitness
from workers.runner.journal import Journal
from workers.runner.master import RETRY, Master, MasterError, Refused
from workers.runner.volume import Volume

log = logging.getLogger("fleethq.worker")

MAX_RUNNING_IDS = 128
BROWSER_RECHECK_S = 300.0
LAST_ERROR_TTL_S = 600.0


def _ocr_task(settings, volume, journal, master, runner):
    from workers.ocr import BrokenWorker, OcrLimits, check_installation
    from workers.runner.ocr_task import OcrTask
    try:
        check_installation(settings.ocr_languages)
    except BrokenWorker as exc:
        runner.mark_broken(f"{exc.reason}: {exc.message}")
    return OcrTask(volume, journal, master, limits=OcrLimits.from_env(),
                   min_free_bytes=settings.min_free_bytes, max_bytes=settings.max_pdf_bytes,
                   on_error=runner.note_error, on_broken=runner.mark_broken)


class Runner:
    def __init__(self, settings, volume: Volume, journal: Journal, master: Master, worker_id: str):
        self.settings, self.volume, self.journal, self.master = settings, volume, journal, master
        self.worker_id = worker_id
        self.stop = threading.Event()
        self.refused: Refused | None = None
        self.status = "active"
        self.last_heartbeat_ok = 0.0        # monotonic time of the last answered heartbeat
        self._last_error: tuple[float, str] | None = None
        self._browser: tuple[float, bool] = (0.0, False)
        self._beat_now = threading.Event()
        self.delivery_wake = threading.Event()
        # Set when the claim loop should look again now: a slot freed, or
        # the node's status changed (an approval should not wait out a pause).
        self.claim_wake = threading.Event()
        self.active: dict[str, threading.Event] = {}   # downloading attempt → cancel flag
        self.in_browser: set[str] = set()               # of those, queued for or in the browser pass
        self._active_lock = threading.Lock()
        self._fetching = 0      # ladder calls running now (not merely queued)
        self.fetch_queue: queue.Queue = queue.Queue()
        self.browser_queue: queue.Queue = queue.Queue()
        # Set when this worker cannot do its task (an OCR worker missing a
        # binary or language pack): it stops claiming and says why on its
        # heartbeat, instead of burning every job's retries.
        self.broken: str | None = None
        # Heartbeats list the projects served (the master then counts this
        # worker only for them); off after an older master refused the field.
        self.says_projects = True
        # Whether the heartbeat may say "no browser lane" (null); an older
        # master takes only true/false.
        self.says_no_browser = True
        # Set by sign_off: the last heartbeat offers no slot.
        self.signed_off = False
        # Whether this worker is itself the problem (its network, its disk):
        # it then backs off and offers no slot (fitness.py).
        self.fitness = Fitness()
        configs = fetch_configs(settings, settings.client_version)
        self._fetch_cfg = configs[1] or configs[0]
        if settings.task == "ocr":
            self.fetcher = _ocr_task(settings, volume, journal, master, self)
        else:
            self.fetcher = Fetcher(volume, journal, configs, max_bytes=settings.max_pdf_bytes,
                                   on_error=self.note_error, on_browser=self._browser_seen,
                                   fitness=self.fitness)
        self._probed = threading.Event()          # the first browser probe has answered
        self._browser_used = False                # the browser pass has run at least once
        self.delivery = Delivery(volume, journal, master, worker_id=worker_id,
                                 retention_s=settings.retention_s, on_error=self.note_error,
                                 wake=self.delivery_wake.set)
        self.claimer = Claimer(self)

    # --- shared state --------------------------------------------------------

    def note_error(self, text: str) -> None:
        self._last_error = (time.monotonic(), text[:2048])  # the heartbeat field's limit

    def mark_broken(self, reason: str) -> None:
        if self.broken is None:
            log.error("this worker cannot do its task (%s): it stops claiming", reason)
        self.broken = reason[:1024]
        self.beat_soon()

    def last_error(self) -> str | None:
        if self.broken:
            return f"broken: {self.broken}"[:2048]
        backing_off = self.fitness.paused()
        if backing_off:
            return backing_off[:2048]
        if self._last_error and time.monotonic() - self._last_error[0] < LAST_ERROR_TTL_S:
            return self._last_error[1]
        return None

    def refuse(self, exc: Refused) -> None:
        if self.refused is None:
            self.refused = exc
            log.error("the master refuses this worker's secret (%s): stopping", exc.message)
        self.stop.set()

    def spool_bytes(self) -> int:
        return sum(e["size"] for e in self.journal.entries("ready", "uploaded"))

    def browser_ok(self) -> bool | None:
        """The browser lane's health; None when this worker has none (OCR,
        --no-browser): nothing there can fail."""
        if not self.settings.use_browser:
            return None if self.says_no_browser else False
        return self._browser[1]

    def _browser_seen(self, ok: bool) -> None:
        """The browser pass ran: its outcome is better evidence than a probe."""
        self._browser_used = True
        if ok != self._browser[1]:
            self.beat_soon()
        self._browser = (time.monotonic(), ok)

    def _browser_loop(self) -> None:
        """Browser health for the heartbeat, in a thread of its own: a slow or
        hanging probe (up to ~45 s) must never delay a heartbeat, or the
        leases it renews could run out.

        The ladder's probe launches a second Chromium (~400 MB). It runs at
        start (the browser pass waits for it, so the two never overlap) and
        again every BROWSER_RECHECK_S only while Chromium is known broken;
        once the browser pass has run, its own outcome keeps browser_ok
        current and no probe runs next to the live browser."""
        while self.settings.use_browser and not self.stop.is_set():
            if not self._browser_used or not self._browser[1]:
                try:
                    from workers.fetch import browser_status
                    ok, reason = browser_status(self._fetch_cfg, max_age_s=BROWSER_RECHECK_S)
                except Exception as exc:  # no playwright at all: the HTTP lanes still run
                    ok, reason = False, f"{type(exc).__name__}: {exc}"
                if not ok and (not self._probed.is_set() or self._browser[1]):
                    log.warning("browser lane unavailable (HTTP lanes only): %s", reason)
                    self.note_error(f"browser unavailable: {reason}")
                if ok != self._browser[1]:
                    self.beat_soon()  # tell the master now, not at the next interval
                self._browser = (time.monotonic(), bool(ok))
                self._probed.set()
            self.stop.wait(BROWSER_RECHECK_S)

    def heartbeat_fresh(self) -> bool:
        # Claims need a heartbeat younger than the node lease (60 s); keep a margin.
        return time.monotonic() - self.last_heartbeat_ok < 45.0

    def start_fetch(self, entry: dict) -> None:
        with self._active_lock:
            self.active[entry["attempt_id"]] = threading.Event()
        self.fetch_queue.put(entry)

    # --- heartbeat -----------------------------------------------------------

    def beat(self, timeout: float = 30) -> dict:
        """One heartbeat. Returns the lease map. Raises MasterError."""
        with self._active_lock:
            fetching = list(self.active)
        holding = [e["attempt_id"] for e in self.journal.entries("ready", "uploaded")]
        running = (fetching + [a for a in holding if a not in fetching])[:MAX_RUNNING_IDS]
        unfit = self.fitness.paused() is not None
        body = {"capacity": 0 if self.broken or self.signed_off or unfit else self.settings.concurrency,
                "browser_ok": self.browser_ok(),
                "disk_free_bytes": self.volume.disk_free(), "spool_bytes": self.spool_bytes(),
                "last_error": self.last_error(), "running_attempt_ids": running}
        if self.says_projects:
            body["projects"] = list(self.settings.projects)[:64]
        answer = self._send_beat(body, timeout)
        self.last_heartbeat_ok = time.monotonic()
        self.claimer.shares.weigh(answer.get("shares") or {})
        if answer.get("status") != self.status:
            log.info("node status: %s", answer.get("status"))
            self.status = answer.get("status")
            self.claim_wake.set()
        leases = answer.get("lease_expires") or {}
        for aid in fetching:
            if aid not in leases:
                with self._active_lock:
                    flag = self.active.get(aid)
                if flag is not None and not flag.is_set():
                    log.warning("attempt %s is no longer leased by the master: cancelled", aid)
                    flag.set()
        return leases

    def _send_beat(self, body: dict, timeout: float) -> dict:
        """POST a heartbeat. A master older than this worker refuses what it
        does not know (the projects, a null browser_ok): say it as older
        workers did from then on."""
        while True:
            try:
                return self.master.call("POST", "/api/v1/fleet/heartbeat", timeout=timeout, body=body)[1]
            except MasterError as exc:
                field = exc.message.split(":", 1)[0] if exc.status == 400 else None
                if field == "projects" and "projects" in body:
                    log.info("the master does not take a heartbeat's projects; leaving them out")
                    self.says_projects = False
                    body = {k: v for k, v in body.items() if k != "projects"}
                elif field == "browser_ok" and body.get("browser_ok") is None:
                    log.info("the master does not take a heartbeat without a browser lane; "
                             "reporting the lane as not ok")
                    self.says_no_browser = False
                    body = {**body, "browser_ok": False}
                else:
                    raise

    def _heartbeat_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.beat()
            except Refused as exc:
                return self.refuse(exc)
            except MasterError as exc:
                log.warning("heartbeat failed: %s", exc)
                self.note_error(f"heartbeat: {exc}")
            self._beat_now.wait(self.settings.heartbeat_s)
            self._beat_now.clear()

    def beat_soon(self) -> None:
        self._beat_now.set()

    # --- fetch slots and delivery --------------------------------------------

    def http_stage(self) -> int:
        """Downloads in the HTTP pass: what ``concurrency`` bounds."""
        with self._active_lock:
            return len(self.active) - len(self.in_browser)

    def _fetch_slot(self, browser: bool = False) -> None:
        source = self.browser_queue if browser else self.fetch_queue
        while browser and not self._probed.wait(1.0):   # never two Chromiums at start
            if self.stop.is_set():
                return
        while not self.stop.is_set():
            try:
                entry = source.get(timeout=1.0)
            except queue.Empty:
                continue
            aid = entry["attempt_id"]
            outcome = None
            with self._active_lock:
                self._fetching += 1
            try:
                outcome = self.fetcher.run(entry, self.active.get(aid) or threading.Event(),
                                           browser=browser)
            finally:
                with self._active_lock:
                    self._fetching -= 1
                    if outcome == NEEDS_BROWSER:
                        self.in_browser.add(aid)     # stays downloading, leaves the HTTP pass
                        self.browser_queue.put(entry)
                    else:
                        self.active.pop(aid, None)
                        self.in_browser.discard(aid)
                self.claim_wake.set()
                self.delivery_wake.set()

    def _delivery_dispatch(self, lanes: dict[str, queue.Queue]) -> None:
        while not self.stop.is_set():
            for aid, lane in self.delivery.due():
                lanes[lane].put(aid)
            self.delivery_wake.wait(1.0)
            self.delivery_wake.clear()

    def _delivery_slot(self, work: queue.Queue) -> None:
        while not self.stop.is_set():
            try:
                aid = work.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self.delivery.handle(aid)
            except Refused as exc:
                return self.refuse(exc)
            except Exception:  # never lose the thread; the entry is retried later
                log.exception("attempt %s: delivery error", aid)

    # --- lifecycle -----------------------------------------------------------

    def resume(self) -> None:
        """Downloads cut short by the last stop: fetch again under the same
        attempt if the master still leases it, else drop them."""
        leftovers = self.journal.entries("downloading")
        for entry in leftovers:
            with self._active_lock:
                self.active[entry["attempt_id"]] = threading.Event()
        tries = 0
        while True:
            try:
                leases = self.beat()
                break
            except Refused:
                raise
            except MasterError as exc:
                tries += 1
                # A refusal carries no pause (0): back off, never spin.
                delay = RETRY.pause(tries, exc.retry_after_s or None) or exc.retry_after_s
                log.warning("first heartbeat failed: %s; retrying in %.1f s", exc, delay)
                if self.stop.wait(delay):
                    return
        for entry in leftovers:
            aid = entry["attempt_id"]
            if aid in leases:
                log.info("attempt %s (job %s): download resumed after restart", aid, entry["job_id"])
                self.fetch_queue.put(entry)
            else:
                with self._active_lock:
                    self.active.pop(aid, None)
                self.journal.update(aid, state="failed", reported=True, error={
                    "code": "cancelled", "message": "lease gone while the worker was down"})
                log.info("attempt %s (job %s): lease gone while stopped; dropped", aid, entry["job_id"])

    def run(self) -> None:
        """Start every loop; return when ``stop`` is set (signal or refusal)."""
        threading.Thread(target=self._browser_loop, name="browser-health", daemon=True).start()
        self.resume()
        lanes = {"send": queue.Queue(), "receipt": queue.Queue()}
        n = self.settings.concurrency
        threads = [("heartbeat", self._heartbeat_loop, ()), ("claim", self.claimer.loop, ()),
                   ("delivery", self._delivery_dispatch, (lanes,))]
        threads += [(f"fetch-{i}", self._fetch_slot, ()) for i in range(n)]
        if self.settings.use_browser:
            threads += [(f"browser-{i}", self._fetch_slot, (True,))
                        for i in range(self.settings.browser_concurrency)]
        # Uploads: as many as fetches, so delivery keeps pace with downloads.
        # Receipt waits are idle long-polls (the master holds no database
        # connection for them): more of them are cheap.
        threads += [(f"upload-{i}", self._delivery_slot, (lanes["send"],)) for i in range(max(2, n))]
        threads += [(f"receipt-{i}", self._delivery_slot, (lanes["receipt"],))
                    for i in range(max(4, 2 * n))]
        for name, target, args in threads:
            threading.Thread(target=target, args=args, name=name, daemon=True).start()
        self.delivery_wake.set()
        self.stop.wait()

    def sign_off(self) -> None:
        """On a clean stop (the host going to sleep, say): one last heartbeat
        offering no slot, so that fallback workers do not wait for this one
        while its heartbeat is still fresh. The leases of the files it keeps
        are renewed as usual."""
        self.signed_off = True
        try:
            self.beat(timeout=5)  # a stop is not held up by a master that does not answer
        except Exception as exc:  # noqa: BLE001 - revoked, unreachable: nothing to sign off from
            log.info("last heartbeat not sent: %s", exc)

    def drain_fetches(self, grace_s: float) -> None:
        """On a clean stop, give running downloads a moment to land as ready
        files; queued ones stay ``downloading`` and resume at the next start."""
        deadline = time.monotonic() + grace_s
        while self._fetching > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
