"""Reconciliation of in-band control messages: the rules a consumer applies per partition."""

from __future__ import annotations

import itertools

import pytest

from weirflow.runtime.control import (
    MAX_TIMESTAMP_MS,
    ControlMessage,
    MalformedMessageError,
    MessageType,
    StreamControl,
    TaskControl,
    decode,
    encode_user,
)

P0, P1 = "local.mid.0", "local.mid.1"


def wm(task: str, ts: int, count: int = 3) -> ControlMessage:
    return ControlMessage(MessageType.WATERMARK, task, count, ts)


def eos(task: str, count: int = 3) -> ControlMessage:
    return ControlMessage(MessageType.END_OF_STREAM, task, count, MAX_TIMESTAMP_MS)


def test_wire_format_round_trips_and_user_payloads_pass_through() -> None:
    message = ControlMessage(MessageType.WATERMARK, "s-1", 4, 1234, run_id="r1")
    raw = message.encode()
    assert raw[0] == 1
    assert decode(raw) == (MessageType.WATERMARK, message)
    assert decode(encode_user(b'{"a":1}')) == (MessageType.USER, b'{"a":1}')
    assert decode(eos("s-0").encode())[0] is MessageType.END_OF_STREAM


@pytest.mark.parametrize("raw", [b"", b"\x07{}", b"\x01not json", b'\x02{"task-name":"x"}'])
def test_malformed_messages_are_rejected_with_a_reason(raw: bytes) -> None:
    with pytest.raises(MalformedMessageError):
        decode(raw)


def test_watermark_is_the_minimum_over_producers_and_unknown_until_all_reported() -> None:
    state = StreamControl()
    state.apply(P0, wm("s-0", 300))
    state.apply(P0, wm("s-1", 100))
    assert state.watermark([P0]) is None  # s-2 has not reported: no watermark yet
    state.apply(P0, wm("s-2", 200))
    assert state.watermark([P0]) == 100


def test_out_of_order_messages_never_move_the_watermark_backwards() -> None:
    state = StreamControl()
    for task in ("s-0", "s-1", "s-2"):
        state.apply(P0, wm(task, 500))
    assert state.watermark([P0]) == 500
    state.apply(P0, wm("s-1", 200))  # an older message arriving late (a replay after a restart)
    assert state.watermark([P0]) == 500


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_any_order_and_duplicates_give_the_same_state(order: tuple[int, ...]) -> None:
    messages = [wm("s-0", 10), wm("s-1", 40), eos("s-2"), wm("s-1", 30)]
    state = StreamControl()
    for index in order:
        state.apply(P0, messages[index])
        state.apply(P0, messages[index])  # duplicated
    assert state.partitions[P0].watermarks == {"s-0": 10, "s-1": 40, "s-2": MAX_TIMESTAMP_MS}
    assert state.watermark([P0]) == 10


def test_partition_ends_only_when_every_producer_sent_end_of_stream() -> None:
    state = StreamControl()
    state.apply(P0, eos("s-0"))
    state.apply(P0, eos("s-1"))
    assert not state.ended([P0])  # s-2 is missing: not ended
    state.apply(P0, eos("s-1"))  # a duplicate does not count twice
    assert not state.ended([P0])
    state.apply(P0, eos("s-2"))
    assert state.ended([P0])
    assert state.watermark([P0]) == MAX_TIMESTAMP_MS


def test_stream_watermark_is_the_minimum_over_partitions_and_ends_with_all_of_them() -> None:
    state = StreamControl()
    for task in ("s-0", "s-1", "s-2"):
        state.apply(P0, wm(task, 900))
        state.apply(P1, wm(task, 700))
    assert state.watermark([P0, P1]) == 700
    for task in ("s-0", "s-1", "s-2"):
        state.apply(P0, eos(task))
    assert state.ended([P0]) and not state.ended([P0, P1])
    assert state.watermark([P0, P1]) == 700


def test_a_partition_nobody_wrote_to_holds_the_watermark_back() -> None:
    state = StreamControl()
    for task in ("s-0", "s-1", "s-2"):
        state.apply(P0, wm(task, 900))
    assert state.watermark([P0, P1]) is None


def test_control_state_survives_a_checkpoint_round_trip() -> None:
    control = TaskControl()
    control.stream("mid").apply(P0, wm("s-0", 5, count=2))
    control.stream("mid").apply(P0, eos("s-1", count=2))
    control.injected["mid"] = 5
    control.dead_letters = 3
    restored = TaskControl.from_json(control.to_json())
    assert restored.to_json() == control.to_json()
    assert restored.stream("mid").watermark([P0]) == 5
    restored.stream("mid").apply(P0, eos("s-0", count=2))
    assert restored.stream("mid").ended([P0])


def drain(task: str, count: int = 3) -> ControlMessage:
    return ControlMessage(MessageType.DRAIN, task, count, MAX_TIMESTAMP_MS, run_id="r1")


def test_a_partition_drains_when_every_producer_sent_drain_or_end_of_stream() -> None:
    state = StreamControl()
    state.apply(P0, drain("s-0"))
    state.apply(P0, drain("s-0"))  # a replayed drain counts once
    state.apply(P0, eos("s-1"))  # a producer that had ended before the drain counts too
    assert not state.ended([P0]) and state.watermark([P0]) is None
    state.apply(P0, drain("s-2"))
    assert state.ended([P0]) and state.any_drained()
    assert state.watermark([P0]) == MAX_TIMESTAMP_MS  # every window flushes

    only_eos = StreamControl()
    for task in ("s-0", "s-1", "s-2"):
        only_eos.apply(P0, eos(task))
    assert only_eos.ended([P0]) and not only_eos.any_drained()  # an end, not a drain


def test_a_drained_task_is_done_in_its_run_and_starts_afresh_in_the_next() -> None:
    control = TaskControl()
    control.stream("mid").apply(P0, drain("s-0", count=1))
    control.injected["mid"] = MAX_TIMESTAMP_MS
    control.sent_watermark = 99
    control.dead_letters = 2
    assert control.draining()
    control.drained = "r1"
    restored = TaskControl.from_json(control.to_json())
    assert restored.drained == "r1" and restored.stream("mid").partitions[P0].drained == {"s-0"}
    assert restored.done_in("r1") and not restored.done_in("r2")
    fresh = restored.for_new_run()
    # no old control state, no drained mark; no window of the new run written yet (`weirflow.spark.rebuild`)
    assert fresh.to_json() == TaskControl(dead_letters=2, closed=-1).to_json()
