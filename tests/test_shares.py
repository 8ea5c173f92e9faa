"""Fair shares between the projects one worker serves (workers/runner/shares.py):
the order and amounts the claim loop asks for, driven as the loop drives it."""
from __future__ import annotations

from workers.runner.shares import Shares


def _rounds(shares: Shares, has_jobs, rounds: int, free: int = 1) -> dict[str, int]:
    """Run the claim loop's rounds with ``free`` slots each: a project gets
    what it asks for when ``has_jobs(project)``."""
    got = {"a": 0, "b": 0}
    left = [0]

    def ask(project, n):
        n = n if has_jobs(project) else 0
        got[project] += n
        left[0] -= n
        return n
    for _ in range(rounds):
        left[0] = free
        shares.round(["a", "b"], ["a", "b"], lambda: left[0], ask)
    return got


def test_weights_three_to_one_give_three_jobs_for_one():
    shares = Shares()
    shares.weigh({"a": 3, "b": 1})
    got = _rounds(shares, lambda p: True, 400)
    assert abs(got["a"] - 300) <= 1 and got["a"] + got["b"] == 400, got


def test_a_whole_fleet_of_free_slots_is_split_by_weight_in_one_round():
    shares = Shares()
    shares.weigh({"a": 3, "b": 1})
    assert _rounds(shares, lambda p: True, 1, free=16) == {"a": 12, "b": 4}


def test_equal_until_the_master_says_otherwise():
    shares = Shares()
    got = _rounds(shares, lambda p: True, 100)
    assert got == {"a": 50, "b": 50}
    shares.weigh({"a": 1, "b": 4, "elsewhere": 7})
    got = _rounds(shares, lambda p: True, 100)
    assert abs(got["b"] - 80) <= 1, got


def test_a_project_that_was_empty_banks_no_credit():
    shares = Shares()
    shares.weigh({"a": 1, "b": 1})
    got = _rounds(shares, lambda p: p == "a", 200)      # b has nothing for 200 rounds
    assert got == {"a": 200, "b": 0}
    got = _rounds(shares, lambda p: True, 40)             # b's jobs arrive
    # Equal shares from now on, not 200 jobs of b to catch up.
    assert abs(got["b"] - 20) <= 1, got


def test_bad_weights_from_a_master_are_ignored():
    shares = Shares()
    shares.weigh({"a": 0, "b": "3", "c": None})
    assert (shares.weight("a"), shares.weight("b"), shares.weight("c")) == (1, 1, 1)
