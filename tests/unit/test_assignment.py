"""Sticky balanced assignment: exactly once, balanced, deterministic, and as sticky as balance allows."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from weirflow.coordination.assignment import assign

task_ids = st.sets(st.integers(0, 60), max_size=40).map(lambda s: [f"t-{i}" for i in sorted(s)])
processor_ids = st.sets(st.integers(0, 9), max_size=8).map(lambda s: [f"p{i}" for i in sorted(s)])


@st.composite
def scenarios(draw):
    tasks = draw(task_ids)
    processors = draw(processor_ids)
    old_processors = draw(processor_ids)
    old_tasks = draw(task_ids)
    previous: dict[str, list[str]] = {p: [] for p in old_processors}
    if old_processors:
        for t in old_tasks:
            previous[draw(st.sampled_from(old_processors))].append(t)
    return tasks, processors, previous


def optimum_kept(tasks: list[str], processors: list[str], previous: dict[str, list[str]]) -> int:
    """The most tasks any balanced assignment can leave in place, computed independently of `assign`."""
    if not processors:
        return 0
    valid = {p: len(set(previous.get(p, [])) & set(tasks)) for p in processors}
    base, extra = divmod(len(tasks), len(processors))
    counts = sorted(valid.values(), reverse=True)
    return sum(min(c, base + (1 if i < extra else 0)) for i, c in enumerate(counts))


@given(scenarios())
def test_every_task_is_assigned_exactly_once(scenario) -> None:
    tasks, processors, previous = scenario
    result = assign(tasks, processors, previous)
    assigned = [t for ts in result.values() for t in ts]
    if processors:
        assert sorted(assigned) == sorted(tasks)
        assert set(result) == set(processors)
    else:
        assert result == {}


@given(scenarios())
def test_assignment_is_balanced(scenario) -> None:
    tasks, processors, previous = scenario
    result = assign(tasks, processors, previous)
    if processors:
        sizes = [len(ts) for ts in result.values()]
        assert max(sizes) - min(sizes) <= 1


@given(scenarios(), st.randoms(use_true_random=False))
def test_assignment_does_not_depend_on_input_order(scenario, rng: random.Random) -> None:
    tasks, processors, previous = scenario
    shuffled_tasks = tasks[:]
    rng.shuffle(shuffled_tasks)
    shuffled_procs = processors[:]
    rng.shuffle(shuffled_procs)
    shuffled_prev = {p: list(reversed(ts)) for p, ts in reversed(list(previous.items()))}
    assert assign(tasks, processors, previous) == assign(shuffled_tasks, shuffled_procs, shuffled_prev)


@given(scenarios())
def test_assignment_keeps_as_many_tasks_in_place_as_balance_allows(scenario) -> None:
    tasks, processors, previous = scenario
    result = assign(tasks, processors, previous)
    kept = sum(len(set(result.get(p, ())) & set(previous.get(p, ()))) for p in processors)
    assert kept == optimum_kept(tasks, processors, previous)


@given(scenarios())
def test_unchanged_membership_moves_nothing(scenario) -> None:
    tasks, processors, _ = scenario
    first = assign(tasks, processors, None)
    assert assign(tasks, processors, first) == first


TWELVE = [f"main-{n}" for n in range(12)]


def test_a_fourth_processor_takes_exactly_three_of_twelve_tasks() -> None:
    before = assign(TWELVE, ["a", "b", "c"], None)
    after = assign(TWELVE, ["a", "b", "c", "d"], before)
    owner_before = {t: p for p, ts in before.items() for t in ts}
    owner_after = {t: p for p, ts in after.items() for t in ts}
    assert sum(owner_before[t] != owner_after[t] for t in TWELVE) == 3
    assert len(after["d"]) == 3
    assert all(set(after[p]) <= set(before[p]) for p in "abc")


def test_a_leaving_processor_moves_only_its_own_tasks() -> None:
    before = assign(TWELVE, ["a", "b", "c"], None)
    after = assign(TWELVE, ["a", "b"], before)
    assert set(after) == {"a", "b"}
    moved = {t for t in TWELVE if t not in before["a"] and t not in before["b"]}
    assert moved == set(before["c"])
    assert set(before["a"]) <= set(after["a"]) and set(before["b"]) <= set(after["b"])


def test_new_tasks_fill_the_emptiest_processors() -> None:
    before = {"a": ("t1", "t2"), "b": ("t3",)}
    after = assign(["t1", "t2", "t3", "t4"], ["a", "b"], before)
    assert after == {"a": ("t1", "t2"), "b": ("t3", "t4")}
