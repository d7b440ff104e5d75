"""Offset planning and message ids of the Spark data source, without Spark or a broker."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

from flux.spark import ids, offsets
from flux.spark.offsets import DataLoss, Position, Range, TopicStatus

G = 0xFEEDFACECAFEBEEF  # above 2**63, like half of all real generations
TOPICS = ["a", "b"]


def plan(start: offsets.Offsets, status: dict[str, TopicStatus], *, max_messages: int | None = None,
         target: offsets.Offsets | None = None, fail: bool = True,
         warnings: list[str] | None = None) -> offsets.Offsets:
    sink = warnings if warnings is not None else []
    return offsets.plan_end(start, status, TOPICS, max_messages=max_messages, target=target,
                            fail_on_data_loss=fail, warn=sink.append)


def test_offsets_survive_a_json_round_trip_in_topic_order() -> None:
    value = {"b": Position(G, 7), "a": Position(1, 0)}
    encoded = offsets.encode(value, TOPICS)
    assert list(encoded) == ["a", "b"]
    assert offsets.decode(json.loads(json.dumps(encoded))) == value


def test_starting_offsets_accept_keywords_kafka_numbers_and_positions() -> None:
    spec = json.dumps({"a": -2, "b": {"generation": hex(G), "next": 3}})
    assert offsets.parse_starting(spec, TOPICS) == {"a": "earliest", "b": Position(G, 3)}
    assert offsets.parse_starting("EARLIEST", TOPICS) == {"a": "earliest", "b": "earliest"}
    assert offsets.parse_starting(None, TOPICS) == {"a": "latest", "b": "latest"}
    assert offsets.parse_starting('{"a": 5, "b": -1}', TOPICS) == {"a": 5, "b": "latest"}


@pytest.mark.parametrize("bad", ['{"a": 1}', '{"a": -3, "b": 0}', "[1]", "soon",
                                 '{"a": {"next": 1}, "b": 0}'])
def test_malformed_starting_offsets_name_the_option(bad: str) -> None:
    with pytest.raises(ValueError, match="startingOffsets"):
        offsets.parse_starting(bad, TOPICS)


def test_topics_option_is_required_and_validated() -> None:
    assert offsets.parse_topics(" a, b ,a") == ["a", "b"]
    with pytest.raises(ValueError, match="topics"):
        offsets.parse_topics("")
    with pytest.raises(ValueError, match="topics"):
        offsets.parse_topics("a..b")


def test_end_takes_everything_held_without_a_limit() -> None:
    start = {"a": Position(G, 2), "b": Position(1, 0)}
    status = {"a": TopicStatus(G, 0, 10), "b": TopicStatus(1, 0, 0)}
    assert plan(start, status) == {"a": Position(G, 10), "b": Position(1, 0)}


def test_limit_is_shared_in_proportion_and_never_exceeded() -> None:
    start = {"a": Position(1, 0), "b": Position(2, 0)}
    status = {"a": TopicStatus(1, 0, 300), "b": TopicStatus(2, 0, 100)}
    end = plan(start, status, max_messages=10)
    assert (end["a"].next, end["b"].next) == (8, 2)
    end = plan(start, status, max_messages=3)
    assert end["a"].next + end["b"].next == 3


def test_share_always_makes_progress_with_a_budget_of_one() -> None:
    assert sum(offsets.share({"a": 5, "b": 5, "c": 5}, 1).values()) == 1


def test_available_now_target_caps_the_end() -> None:
    start = {"a": Position(1, 0), "b": Position(2, 4)}
    status = {"a": TopicStatus(1, 0, 50), "b": TopicStatus(2, 0, 50)}
    target = {"a": Position(1, 20), "b": Position(2, 4)}
    assert plan(start, status, target=target) == {"a": Position(1, 20), "b": Position(2, 4)}


def test_generation_change_fails_the_query_by_default() -> None:
    start = {"a": Position(1, 5), "b": Position(2, 0)}
    status = {"a": TopicStatus(9, 0, 3), "b": TopicStatus(2, 0, 0)}
    with pytest.raises(DataLoss, match=r"reset.*failOnDataLoss=false"):
        plan(start, status)


def test_generation_change_moves_to_offset_zero_with_a_warning() -> None:
    start = {"a": Position(1, 5), "b": Position(2, 0)}
    status = {"a": TopicStatus(9, 0, 3), "b": TopicStatus(2, 0, 0)}
    warnings: list[str] = []
    end = plan(start, status, fail=False, warnings=warnings)
    assert end["a"] == Position(9, 0)
    assert offsets.ranges(start, end, TOPICS) == []   # nothing of "a" in the switching batch
    assert warnings and "reset" in warnings[0]


def test_cleaned_up_start_skips_ahead_or_fails() -> None:
    start = {"a": Position(1, 5), "b": Position(2, 0)}
    status = {"a": TopicStatus(1, 8, 12), "b": TopicStatus(2, 0, 0)}
    with pytest.raises(DataLoss, match=r"5\.\.7"):
        plan(start, status)
    assert plan(start, status, fail=False)["a"] == Position(1, 8)


def test_new_topic_starts_at_its_oldest_message() -> None:
    status = {"a": TopicStatus(1, 0, 4), "b": TopicStatus(2, 3, 9)}
    end = plan({"a": Position(1, 0)}, status)
    assert end == {"a": Position(1, 4), "b": Position(2, 3)}


def test_split_is_deterministic_and_covers_each_range_exactly() -> None:
    batch = [Range("a", 1, 0, 25), Range("b", 2, 10, 11)]
    parts = offsets.split(batch, max_per_partition=10)
    assert parts == offsets.split(batch, max_per_partition=10)
    covered = [(p.topic, o) for p in parts for o in range(p.start, p.end)]
    assert covered == [("a", o) for o in range(25)] + [("b", 10)]
    assert all(p.end - p.start <= 10 for p in parts)
    assert len(offsets.split(batch, max_per_partition=100, min_partitions=4)) >= 4


def test_row_ids_tell_identical_rows_apart_and_repeat_on_rerun() -> None:
    fields = ["payload", "n"]
    rows = [[b"x", 1], [b"y", 2], [b"x", 1]]
    first = ids.RowIds("q:0:3")
    made = [first.next_id(fields, r) for r in rows]
    assert len(set(made)) == 3
    again = ids.RowIds("q:0:3")
    rerun = [again.next_id(fields, r) for r in reversed(rows)]
    assert sorted(rerun) == sorted(made)
    assert all(len(m.encode()) <= 128 for m in made)


def test_row_hash_is_stable_for_rich_values() -> None:
    when = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
    values = [bytearray(b"p"), decimal.Decimal("1.50"), when, {"k": [1, 2]}, None]
    fields = ["a", "b", "c", "d", "e"]
    assert ids.row_hash(fields, values) == ids.row_hash(fields, list(values))
    # pinned: a retried task in another process (other PYTHONHASHSEED) must get the same id
    assert ids.row_hash(["payload"], [b"hello"]) == "f9cca18dd9f7d391"
    assert ids.row_hash(["payload"], [b"hello"]) != ids.row_hash(["payload"], [b"hellp"])


def test_batch_ranges_read_what_is_held_between_start_and_end() -> None:
    status = {"a": TopicStatus(1, 2, 9), "b": TopicStatus(G, 0, 4)}
    starts = offsets.parse_starting('{"a": 3, "b": "earliest"}', TOPICS)
    ends = offsets.parse_starting(None, TOPICS)
    got = offsets.batch_ranges(starts, ends, status, TOPICS, fail_on_data_loss=True, warn=print)
    assert got == [Range("a", 1, 3, 9), Range("b", G, 0, 4)]


def test_batch_ranges_report_cleaned_up_and_reset_topics() -> None:
    status = {"a": TopicStatus(1, 5, 9), "b": TopicStatus(G, 0, 4)}
    starts: dict[str, offsets.Start] = {"a": 0, "b": Position(7, 0)}
    ends = offsets.parse_starting(None, TOPICS)
    with pytest.raises(DataLoss, match=r"0\.\.4"):
        offsets.batch_ranges(starts, ends, status, TOPICS, fail_on_data_loss=True, warn=print)
    warnings: list[str] = []
    got = offsets.batch_ranges(starts, ends, status, TOPICS, fail_on_data_loss=False,
                               warn=warnings.append)
    assert got == [Range("a", 1, 5, 9)]
    assert len(warnings) == 2 and "reset" in warnings[1]
    with pytest.raises(ValueError, match="past"):
        offsets.batch_ranges({"a": 0, "b": 0}, {"a": 10, "b": 0}, status, TOPICS,
                             fail_on_data_loss=False, warn=print)
