"""``fleethq-worker``: the worker program for pdf projects (DESIGN §7, §8, §9).

One process per volume. Modules, each small:

    settings   flags and FLEETHQ_* environment → :class:`Settings`
    volume     the volume layout, its lock, the identity file, atomic writes
    journal    the results journal (one JSON file, replaced atomically)
    master     HTTP to the master: HTTPS only, no redirects, error envelope
    enroll     identity → register → wait for approval
    recovery   startup checks: re-hash ready files, clear partial downloads
    fetching   one claimed job → fetch ladder → a ready file or a failure
    delivery   ready file → upload → receipt → delete; failure reports
    runner     the threads: heartbeat, claim, fetch slots, delivery
    cli        ``fleethq-worker run|status`` and the exit codes

Nothing here imports ``app`` or Flask: it runs on worker computers.
"""

# Exit codes of ``fleethq-worker`` (documented in docs/worker.md).
EXIT_OK = 0            # stopped by SIGTERM/SIGINT after a clean shutdown
EXIT_ERROR = 1         # unexpected error
EXIT_USAGE = 2         # bad flags or settings
EXIT_REVOKED = 3       # the master refuses this worker's secret (revoked or rejected)
EXIT_LOCKED = 4        # another runner holds the volume
EXIT_CORRUPT = 5       # journal or ready file on the volume is damaged
EXIT_ENROLL = 6        # enrollment refused (credential invalid, expired or used)
