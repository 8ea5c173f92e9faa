"""The sites' share of a claim: which site keys a claim may not take now
(at their limit, paused) and how many jobs of each limited site it may take.

A claim of a project that a site rule or pause may touch (:func:`admit`):

1. reads the rules that apply, the pauses and each rule's attempts in flight
   without locks: an estimate of which sites are full;
2. asks the claim for the sites of its next jobs, passing over paused and
   (by the estimate) full sites (``scan``: a bounded window in claim order);
3. for those sites in that order, locks each one's rule row — ``SKIP LOCKED``:
   a rule another claim holds is passed over, never waited for — counts its
   attempts in flight again in a statement of its own (which sees every
   claim that committed before the lock was granted) and stops once the
   rules it holds leave room for the claim;
4. every other limited site is blocked for this claim.

The claim then takes at most the allowance of each site it holds, and
:func:`spend` takes the starts from the rules' buckets before the claim
commits and releases the locks. Only a claim holding a site's rule takes
that site's jobs, so a limit holds under any interleaving; two claims never
wait for each other's rules, and a project no rule or pause touches skips
all of this (``ProjectView.site_rules``).

Which rule applies to a job: a job's site is the group its key belongs to
(``site_groups``), else its key; a rule for the claiming project replaces the
fleet-wide rule of the same site there. A fleet-wide rule counts attempts in
flight across every project, a project's rule that project's.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import text

from app.extensions import db
from app.projects import ratelimit

# How soon a claim held back by a site asks again: a slot freed in another
# project (a fleet-wide rule) wakes no one here.
SLOT_RECHECK_S = 1.0
# How many times a claim looks further down the queue for sites it may hold.
SCAN_ROUNDS = 8

_RULES = """
SELECT l.id, l.site, l.project_id, l.max_in_flight, l.max_starts_per_s, l.tokens,
       extract(epoch FROM clock_timestamp() - l.refilled_at)
FROM site_limits l
WHERE l.project_id = :p OR (l.project_id IS NULL AND NOT EXISTS (
    SELECT 1 FROM site_limits o WHERE o.project_id = :p AND o.site = l.site))
ORDER BY l.id
"""

_LOCK_RULE = """
SELECT tokens, extract(epoch FROM clock_timestamp() - refilled_at) FROM site_limits
WHERE id = :i FOR UPDATE SKIP LOCKED
"""

_PAUSED = "SELECT site, extract(epoch FROM until - now()) FROM site_pauses WHERE until > now()"

_MEMBERS = "SELECT site, site_key FROM site_groups WHERE site = ANY(:sites)"

_IN_FLIGHT = """
SELECT r.rule, count(j.id)
FROM unnest(CAST(:rules AS bigint[]), CAST(:keys AS text[]), CAST(:scopes AS text[])) AS r(rule, key, scope)
JOIN jobs j ON j.site_key = r.key AND j.state = 'wip' AND (r.scope IS NULL OR j.project_id = r.scope)
GROUP BY r.rule
"""


@dataclass
class _Rule:
    id: int
    site: str
    rate: float | None
    tokens: float | None      # after refill; None without a rate
    keys: list[str]
    allowance: int            # jobs this claim may start


@dataclass
class Gate:
    """What a claim may take of the limited and paused sites."""
    blocked: list[str] = field(default_factory=list)      # keys: none of their jobs now
    limited: list[_Rule] = field(default_factory=list)    # rules with room left
    spent: list[_Rule] = field(default_factory=list)      # rules a claim round filled
    recheck_s: float | None = None                        # when a held-back site may open

    def params(self) -> dict:
        """The claim statement's parameters (leasing._SITE_CTE)."""
        keys, rules, allow = [], [], []
        for index, rule in enumerate(self.limited):
            for key in rule.keys:
                keys.append(key)
                rules.append(index)
                allow.append(rule.allowance)
        return {"site_blocked": self.blocked, "site_keys": keys, "site_rules": rules,
                "site_allow": allow}

    def take(self, site_keys: Iterable[str | None]) -> bool:
        """Count jobs a claim round took against the allowances; a site it
        filled is blocked for the next round. Whether any site filled."""
        taken = Counter(site_keys)
        filled = False
        for rule in list(self.limited):
            rule.allowance -= sum(taken.get(key, 0) for key in rule.keys)
            if rule.allowance <= 0:
                self.limited.remove(rule)
                self.spent.append(rule)
                self.blocked += rule.keys
                filled = True
        return filled

    def _hint(self, seconds: float) -> None:
        self.recheck_s = seconds if self.recheck_s is None else min(self.recheck_s, seconds)


def _members(sites: Iterable[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {site: [site] for site in sites}
    if found:
        for site, key in db.session.execute(text(_MEMBERS), {"sites": list(found)}).all():
            found[site].append(key)
    return found


@dataclass
class _Candidate:
    rule: _Rule
    max_in_flight: int | None
    scope: str | None


def _room(rule: _Rule, max_in_flight: int | None, live: int) -> tuple[int, float | None]:
    """Starts the rule leaves room for, and when a full rule may have room."""
    room, wait = math.inf, None
    if max_in_flight is not None:
        room = max(0, max_in_flight - live)
        if room == 0:
            wait = SLOT_RECHECK_S
    if rule.rate is not None and rule.tokens is not None:
        starts = ratelimit.grantable(rule.tokens, 1 << 30)
        if starts == 0:
            wait = min(wait or math.inf, ratelimit.retry_after_ms(rule.tokens, rule.rate) / 1000.0)
        room = min(room, starts)
    return int(min(room, 1 << 30)), wait


def _in_flight(candidates: list[_Candidate]) -> dict[int, int]:
    flat = [(c.rule.id, key, c.scope) for c in candidates if c.max_in_flight is not None
            for key in c.rule.keys]
    if not flat:
        return {}
    return dict(db.session.execute(text(_IN_FLIGHT), {
        "rules": [f[0] for f in flat], "keys": [f[1] for f in flat],
        "scopes": [f[2] for f in flat]}).all())


def admit(project_id: str, want: int, scan: Callable[[list[str]], list[str]]) -> Gate:
    """Say what this claim may take of the limited and paused sites, holding
    the rules it may take from (until the claim's transaction ends).

    ``scan(excluded_keys)``: the site keys of the claim's next jobs in claim
    order, leaving out the keys given.
    """
    rows = db.session.execute(text(_RULES), {"p": project_id}).all()
    paused = dict(db.session.execute(text(_PAUSED)).all())
    members = _members({r[1] for r in rows} | set(paused))
    gate = Gate()
    for site, left_s in paused.items():
        gate.blocked += members[site]
        gate._hint(max(0.0, float(left_s)))
    candidates: list[_Candidate] = []
    for rule_id, site, scope, max_in_flight, rate, tokens, elapsed in rows:
        if site in paused:
            continue
        if rate is not None:
            tokens = ratelimit.refill(tokens, float(elapsed), rate)
        candidates.append(_Candidate(_Rule(rule_id, site, rate, tokens, members[site], 0),
                                     max_in_flight, scope))
    # 1. The estimate: full sites, by a count that takes no lock.
    estimate = _in_flight(candidates)
    full = {c.rule.id for c in candidates
            if _room(c.rule, c.max_in_flight, estimate.get(c.rule.id, 0))[0] == 0}
    by_key = {key: c for c in candidates for key in c.rule.keys}
    excluded = gate.blocked + [k for c in candidates if c.rule.id in full for k in c.rule.keys]
    # 2-3. The sites of the claim's next jobs, their rules held one by one;
    # a site held by another claim or full is left out of the next look.
    held: set[int] = set()
    room_held = 0
    for _ in range(SCAN_ROUNDS):
        keys = [k for k in scan(excluded) if k not in excluded]
        if not keys:
            break
        for key in keys:
            found = by_key.get(key)
            if found is None:
                room_held = want            # a site without a rule: the claim has work
                break
            excluded += found.rule.keys
            if found.rule.id in held:
                continue
            locked = db.session.execute(text(_LOCK_RULE), {"i": found.rule.id}).first()
            if locked is None:
                continue                    # another claim holds it: its jobs are that claim's
            if found.rule.rate is not None:
                found.rule.tokens = ratelimit.refill(locked[0], float(locked[1]), found.rule.rate)
            live = _in_flight([found]).get(found.rule.id, 0)
            room, wait = _room(found.rule, found.max_in_flight, live)
            if wait is not None:
                gate._hint(wait)
            held.add(found.rule.id)
            if room > 0:
                found.rule.allowance = room
                gate.limited.append(found.rule)
                room_held += room
                if room_held >= want:
                    break
        if room_held >= want:
            break
    # 4. Every limited site this claim does not hold is not its to take.
    limited_ids = {rule.id for rule in gate.limited}
    for c in candidates:
        if c.rule.id not in limited_ids:
            gate.blocked += c.rule.keys
    if full:
        gate._hint(SLOT_RECHECK_S)
    return gate


def spend(gate: Gate, site_keys: Iterable[str | None]) -> None:
    """Take the claimed jobs' starts from their rules' buckets (before the
    claim commits)."""
    taken = Counter(site_keys)
    updates = []
    for rule in gate.limited + gate.spent:
        if rule.rate is None or rule.tokens is None:
            continue
        started = sum(taken.get(key, 0) for key in rule.keys)
        if started:
            updates.append({"i": rule.id, "t": rule.tokens - started})
    if updates:
        db.session.execute(text(
            "UPDATE site_limits SET tokens = :t, refilled_at = clock_timestamp() WHERE id = :i"), updates)
