"""Which project a worker that serves several asks next: fair shares.

Each project has a weight (its ``share_weight``, which the master sends in
the heartbeat's answer; 1 until the first answer). The worker keeps a tally
per project: the jobs it has taken from it divided by its weight. Each round
asks the projects lowest tally first, each for its weight's part of the free
slots, so two projects of weights 3 and 1 with jobs to give end up with three
jobs of the first for each of the second, whichever is deeper.

No credit is banked: a project that had nothing to give in a round is raised
to the lowest tally of those that gave, so a queue that was empty for an hour
does not then take every slot for an hour. The bench
(``bench/politeness.py``) measures the shares with this same class.
"""
from __future__ import annotations

import math
from collections.abc import Callable


class Shares:
    def __init__(self) -> None:
        self._weights: dict[str, int] = {}
        self._tally: dict[str, float] = {}

    def weigh(self, weights: dict[str, int]) -> None:
        """Take the weights the master sent (projects not named keep theirs)."""
        for project, weight in weights.items():
            if isinstance(weight, int) and weight >= 1:
                self._weights[project] = weight

    def round(self, serves: list[str], due: list[str], free: Callable[[], int],
              ask: Callable[[str, int], int]) -> int:
        """One round of claims: ask each due project (of the ``serves`` this
        worker serves) in turn, lowest tally first, for its weight's part of
        the free slots, until none is free. ``ask(project, n)`` claims at
        most n jobs and returns how many it got. Returns the projects that
        gave jobs."""
        order = self.order(due)
        quotas = self.quotas(order, free())
        gave: list[str] = []
        # Projects waiting out a retry_after have nothing to give either.
        empty = [p for p in serves if p not in due]
        for project in order:
            room = free()
            if room <= 0:
                break   # the rest were not asked: they keep their place
            n = ask(project, min(room, quotas[project]))
            self.took(project, n)
            (gave if n else empty).append(project)
        self.settle(gave, empty)
        return len(gave)

    def weight(self, project: str) -> int:
        return self._weights.get(project, 1)

    def order(self, projects: list[str]) -> list[str]:
        """The projects to ask this round, lowest tally first; ties keep the
        given order (the caller rotates it, so ties take turns)."""
        floor = min(self._tally.values(), default=0.0)
        for project in projects:
            self._tally.setdefault(project, floor)   # a newcomer starts level
        return sorted(projects, key=lambda p: self._tally[p])

    def quotas(self, projects: list[str], free: int) -> dict[str, int]:
        """How many of ``free`` slots each project may fill this round: its
        weight's part, at least one (the lowest tally asks first, so with one
        free slot the shares come out over the rounds)."""
        total = sum(self.weight(p) for p in projects) or 1
        return {p: max(1, math.floor(free * self.weight(p) / total + 0.5)) for p in projects}

    def took(self, project: str, jobs: int) -> None:
        if jobs > 0:
            self._tally[project] = self._tally.get(project, 0.0) + jobs / self.weight(project)

    def settle(self, gave: list[str], empty: list[str]) -> None:
        """End of a round: projects that gave nothing come up to the lowest
        tally of those that gave (no banking)."""
        if not gave:
            return
        floor = min(self._tally[p] for p in gave)
        for project in empty:
            if self._tally.get(project, 0.0) < floor:
                self._tally[project] = floor
