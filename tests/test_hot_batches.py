"""Requests of one key that arrive while its statement runs share the next
one (app/api/hot_batches.py): each gets its own results, none waits for ever,
and a failed statement leaves its requests to be answered another way."""
from __future__ import annotations

import threading
import time

import pytest

from app.api.hot_batches import Batches


class Statements:
    """A stand-in for the database: records each batch it is given; the
    first may be held until ``release``."""

    def __init__(self, hold_first: bool = False, fail_on: int | None = None, answer_none_on: int | None = None):
        self.batches: list[list] = []
        self.released = threading.Event()
        if not hold_first:
            self.released.set()
        self.running = threading.Event()
        self.fail_on = fail_on
        self.answer_none_on = answer_none_on

    def __call__(self, items: list) -> list | None:
        self.batches.append(list(items))
        number = len(self.batches)
        self.running.set()
        assert self.released.wait(10)
        if number == self.fail_on:
            raise RuntimeError("the connection dropped")
        if number == self.answer_none_on:
            return None
        return [f"result of {item}" for item in items]


def waiting(batches: Batches, key) -> int:
    line = batches._lines.get(key)
    return len(line.waiting) if line is not None else 0


def until(condition, within_s: float = 5) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def submit_in_threads(batches: Batches, key, requests: list[list], run) -> tuple[list[threading.Thread], dict]:
    answers: dict = {}

    def one(index: int, items: list) -> None:
        answers[index] = batches.submit(key, items, run)
    threads = [threading.Thread(target=one, args=(i, items)) for i, items in enumerate(requests)]
    for thread in threads:
        thread.start()
    return threads, answers


def behind_a_held_statement(batches: Batches, run: Statements, requests: list[list]) -> tuple[dict, dict]:
    """One request's statement held while ``requests`` arrive and wait; then
    released. The answers of the first and of the later requests."""
    first, first_answer = submit_in_threads(batches, "w1", [["lead"]], run)
    assert run.running.wait(5)
    later, answers = submit_in_threads(batches, "w1", requests, run)
    until(lambda: waiting(batches, "w1") == len(requests))
    run.released.set()
    for thread in first + later:
        thread.join(10)
        assert not thread.is_alive(), "a request waited for ever"
    return first_answer, answers


def test_a_request_with_nothing_running_runs_at_once_alone():
    seen: list[int] = []
    batches = Batches(256, seen.append)
    run = Statements()
    assert batches.submit("w1", ["a", "b"], run) == ["result of a", "result of b"]
    assert run.batches == [["a", "b"]]
    assert seen == [1]
    assert batches._lines == {}, "an idle key leaves nothing behind"


def test_requests_arriving_while_a_statement_runs_share_the_next_one():
    seen: list[int] = []
    batches = Batches(256, seen.append)
    run = Statements(hold_first=True)
    first_answer, answers = behind_a_held_statement(batches, run, [[f"j{i}", f"k{i}"] for i in range(5)])
    assert first_answer == {0: ["result of lead"]}
    assert len(run.batches) == 2, "the five waiting requests went in one statement"
    assert sorted(run.batches[1]) == sorted(f"{p}{i}" for i in range(5) for p in "jk")
    for i in range(5):
        assert answers[i] == [f"result of j{i}", f"result of k{i}"], "each request has its own results"
    assert seen == [1, 5]
    assert batches._lines == {}


def test_a_statement_takes_no_more_items_than_its_limit():
    batches = Batches(4)
    run = Statements(hold_first=True)
    _, answers = behind_a_held_statement(batches, run, [[f"a{i}", f"b{i}"] for i in range(3)])
    assert [len(batch) for batch in run.batches] == [1, 4, 2]
    assert all(answers[i] == [f"result of a{i}", f"result of b{i}"] for i in range(3))


def test_other_keys_do_not_wait():
    batches = Batches(256)
    held = Statements(hold_first=True)
    first, _ = submit_in_threads(batches, "w1", [["lead"]], held)
    assert held.running.wait(5)
    assert batches.submit("w2", ["x"], Statements()) == ["result of x"]
    held.released.set()
    for thread in first:
        thread.join(10)


@pytest.mark.parametrize("failure", ["fail_on", "answer_none_on"])
def test_a_failed_statement_leaves_its_requests_unanswered_and_the_line_moving(failure):
    batches = Batches(256)
    run = Statements(hold_first=True, **{failure: 2})
    first_answer, answers = behind_a_held_statement(batches, run, [["a"], ["b"]])
    assert first_answer == {0: ["result of lead"]}
    assert answers == {0: None, 1: None}
    assert batches._lines == {}
    assert batches.submit("w1", ["c"], run) == ["result of c"], "the key serves again"
