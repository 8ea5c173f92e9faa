"""The project policy's fields (DESIGN §5), declared once.

Everything that reads or writes a policy derives from this table: the
master's checks (``app.projects.policy``), its API schema, the admin page's
form, ``flask fleet put-project`` and ``hqctl project put/set``. Adding a
field here (and a column on ``projects``) is what adding a field takes;
``tests/test_policy_fields.py`` fails when any of them disagrees.

Defaults depend on the project's kind and live with the master
(``app.projects.policy.defaults``).
"""
from __future__ import annotations

from dataclasses import dataclass

from workers.wire.protocol import IDENTITY_MODES, INT32_MAX

PROJECT_KINDS = ("generic", "pdf", "documents")
PROJECT_STATUSES = ("active", "draining", "archived")
CLAIM_ORDERS = ("fifo", "random")
# Which lane a job is offered first (app.fleet.lanes): the master's own
# fetcher, or the remote workers.
LANE_ORDERS = ("local_first", "remote_first")
# The most distinct workers a project may let try one job.
MAX_WORKER_ATTEMPTS = 20
MAX_SHARE_WEIGHT = 1000

# What a field holds: one of a few words, a whole number in a range, a rate
# (a finite number > 0, or null for no limit), true/false, or the list of
# client versions workers must send.
CHOICE, INTEGER, RATE, SWITCH, VERSIONS = "choice", "integer", "rate", "switch", "versions"


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    lo: int | None = None              # INTEGER: the range, inclusive
    hi: int | None = None
    nullable: bool = False             # null means "no limit" (RATE is always nullable)
    choices: tuple[str, ...] = ()      # CHOICE
    versioned: bool = False            # a change bumps policy_version: workers re-read the policy
    fixed: bool = False                # set when the project is made, never changed
    summary: str = ""                  # a few words: form placeholders, flag help
    help: str = ""                     # what the range does not say, in full

    @property
    def range_text(self) -> str:
        """The accepted values in a few characters: ``1..256``, ``null or ≥ 60``."""
        if self.type == CHOICE:
            return "|".join(self.choices)
        if self.type == RATE:
            return "null or > 0"
        if self.type == SWITCH:
            return "true|false"
        if self.type == VERSIONS:
            return "list of versions"
        bounds = f"≥ {self.lo}" if self.hi == INT32_MAX else f"{self.lo}..{self.hi}"
        return f"null or {bounds}" if self.nullable else bounds

    @property
    def hint(self) -> str:
        """The range, then the summary: what a form field or a flag shows."""
        return f"{self.range_text}: {self.summary}" if self.summary else self.range_text

    @property
    def metavar(self) -> str:
        """How a command line names its value."""
        if self.type == CHOICE:
            return self.range_text
        if self.type == SWITCH:
            return "true|false"
        if self.type == VERSIONS:
            return "V[,V...]"
        unit = "QPS" if self.type == RATE else "S" if self.name.endswith("_seconds") else "N"
        return f"{unit}|null" if self.nullable or self.type == RATE else unit


def N_(text: str) -> str:
    """Marks a summary or help for the pages' translation catalogs (pybabel
    extracts ``N_``); the pages translate it when they show it, while the
    command lines and the API keep the English."""
    return text


_NULLABLE_COUNT = {"type": INTEGER, "lo": 1, "hi": INT32_MAX, "nullable": True, "versioned": True}

FIELDS: tuple[Field, ...] = (
    Field("kind", CHOICE, choices=PROJECT_KINDS, fixed=True, summary=N_("what its workers do")),
    Field("status", CHOICE, choices=PROJECT_STATUSES,
          summary=N_("draining hands out no new jobs; archived also refuses reports")),
    Field("identity_mode", CHOICE, choices=IDENTITY_MODES, fixed=True,
          summary=N_("what makes two enqueued jobs the same job")),
    # Applied by the server alone, so not versioned (as in the v1 contract).
    Field("claim_order", CHOICE, choices=CLAIM_ORDERS, summary=N_("the order jobs are handed out")),
    Field("dispatch_qps", RATE, nullable=True, versioned=True,
          summary=N_("project-wide jobs handed out per second")),
    Field("worker_claim_qps", RATE, nullable=True, versioned=True,
          summary=N_("per-worker claim pace (SDK)")),
    Field("max_jobs_per_claim", INTEGER, 1, 256, versioned=True,
          summary=N_("jobs one claim may take")),
    Field("max_resets", INTEGER, 0, 1000, versioned=True,
          summary=N_("retries before a job is reset_exhausted")),
    Field("recommended_lease_seconds", INTEGER, 1, 3600, versioned=True,
          summary=N_("the lease workers ask for")),
    Field("retry_backoff_seconds", INTEGER, 0, 86400, versioned=True,
          summary=N_("a failed job's wait before its retry")),
    Field("client_versions", VERSIONS, versioned=True,
          summary=N_("worker versions allowed to claim; none blocks every worker")),
    Field("max_in_flight", **_NULLABLE_COUNT, summary=N_("jobs in flight across the fleet")),
    Field("max_worker_in_flight", **_NULLABLE_COUNT, summary=N_("jobs in flight per worker")),
    Field("prefer_new_worker", SWITCH, versioned=True,
          summary=N_("retries go to a worker that has not tried the job")),
    Field("max_worker_attempts", INTEGER, 1, MAX_WORKER_ATTEMPTS, nullable=True, versioned=True,
          summary=N_("distinct workers that may try one job"),
          help=N_("the most distinct workers that may try one job (1..20); a job tried by that many "
               "fails with no_eligible_worker; null means no limit (pdf default 3)")),
    Field("task_timeout_seconds", INTEGER, 60, INT32_MAX, nullable=True, versioned=True,
          summary=N_("deadline of the whole job, from its first claim"),
          help=N_("deadline of the whole job in seconds (null or >= 60), counted from its first "
               "claim, not from enqueue: a job waiting in the queue never expires, and its "
               "retries keep the deadline the first claim set; a job whose worker went away "
               "(its lease ran out) waits with the rest of it paused; jobs naming attr.pages "
               "(OCR runs) get 30 s more a page (pdf default 900, documents none)")),
    Field("attempt_timeout_seconds", INTEGER, 15, INT32_MAX, nullable=True, versioned=True,
          summary=N_("deadline of one attempt")),
    Field("upload_timeout_seconds", INTEGER, 10, 600, versioned=True,
          summary=N_("the longest one upload may take")),
    # Applied by the server alone (like claim_order), so not versioned.
    Field("fallback_after_seconds", INTEGER, 0, 86400,
          summary=N_("a job's wait before a fallback-tier worker may take it"),
          help=N_("seconds a claimable job waits before a fallback-tier worker may take it while a "
               "first-choice worker has free capacity (0..86400, default 60)")),
    Field("lane_order", CHOICE, choices=LANE_ORDERS,
          summary=N_("which lane a job is offered first"),
          help=N_("which lane a job is offered first: local_first (pdf's default) offers it to the "
               "master's own fetcher, and remote workers take what waited fallback_after_seconds "
               "or what the fetcher has no slot for; remote_first (documents, generic) the other "
               "way round. It decides the tier of every worker left on tier auto")),
    # Read by workers from their heartbeat's answer, not from the policy route.
    Field("share_weight", INTEGER, 1, MAX_SHARE_WEIGHT,
          summary=N_("this project's share of a worker that serves several"),
          help=N_("a worker that serves several projects takes jobs from them in proportion to "
               "their weights (1..1000, default 1): weights 3 and 1 give three jobs of the "
               "first for one of the second while both have jobs; a project with none to give "
               "saves no credit for later")),
)
BY_NAME = {field.name: field for field in FIELDS}
