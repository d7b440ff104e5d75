"""Topic policies in the config: patterns, first match wins, inherited keys, validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flux import config
from flux.config import Config
from flux.errors import ConfigError
from flux.policies import check_pattern, matches


def with_topics(*policies: dict[str, Any]) -> Config:
    return config.from_dict({"topics": list(policies)})


def refused(path: str, topics: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config.from_dict({"topics": topics})
    assert info.value.path == path, str(info.value)
    assert path in str(info.value)
    return info.value


@pytest.mark.parametrize(("pattern", "topic", "expected"), [
    ("orders", "orders", True),
    ("orders", "orders.eu", False),
    ("orders.*", "orders.eu", True),
    ("orders.*", "orders", False),
    ("orders.*", "orders.eu.x", False),
    ("orders.>", "orders.eu", True),
    ("orders.>", "orders.eu.x.y", True),
    ("orders.>", "orders", False),
    ("orders.>", "billing.eu", False),
    ("*.eu", "orders.eu", True),
    ("*.eu", "orders.us", False),
    ("*", "orders", True),
    ("*", "orders.eu", False),
    (">", "orders", True),
    (">", "orders.eu.x", True),
    ("*.>", "orders", False),
    ("*.>", "orders.eu", True),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.b.d", False),
])
def test_star_matches_one_token_and_a_final_gt_one_or_more(pattern: str, topic: str,
                                                           expected: bool) -> None:
    assert matches(tuple(check_pattern(pattern).split(".")), tuple(topic.split("."))) is expected
    assert (with_topics({"match": pattern}).settings_for(topic).match == pattern) is expected


def test_first_matching_policy_wins() -> None:
    cfg = with_topics({"match": "orders.eu", "topic": {"max_bytes": 1000}},
                      {"match": "orders.>", "message": {"ttl": 3600}},
                      {"match": ">", "message": {"ttl": 1}})
    eu = cfg.settings_for("orders.eu")
    assert (eu.match, eu.max_bytes, eu.ttl) == ("orders.eu", 1000, 60.0)
    us = cfg.settings_for("orders.us")
    assert (us.match, us.ttl, us.max_bytes) == ("orders.>", 3600.0, 268435456)
    assert cfg.settings_for("billing").ttl == 1.0


def test_a_policy_inherits_every_key_it_omits_from_the_global_keys() -> None:
    cfg = config.from_dict({
        "message": {"ttl": 7, "dedup_window": 9},
        "topic": {"max_bytes": 5000},
        "subscriber": {"retry_count": 2, "retry_interval": 0.5, "timeout": 3,
                       "inactive_time": 11},
        "topics": [{"match": "a.*", "subscriber": {"timeout": 8}}],
    })
    settings = cfg.settings_for("a.b")
    assert settings.as_dict() == {
        "match": "a.*", "message.ttl": 7.0, "message.dedup_window": 9.0, "message.max_delay": 2592000.0,
        "dead_letter.enabled": False, "dead_letter.ttl": 604800.0,
        "topic.max_bytes": 5000, "subscriber.retry_count": 2,
        "subscriber.retry_interval": 0.5, "subscriber.timeout": 8.0,
        "subscriber.inactive_time": 11.0, "storage.kind": "memory", "storage.max_bytes": 0}
    assert cfg.settings_for("b") == cfg.global_settings
    assert cfg.global_settings.match is None and cfg.global_settings.timeout == 3.0


def test_every_per_topic_key_is_accepted_and_durations_become_floats() -> None:
    cfg = with_topics({"match": "t", "message": {"ttl": 1, "dedup_window": 2},
                       "topic": {"max_bytes": 3},
                       "subscriber": {"retry_count": 4, "retry_interval": 5, "timeout": 6,
                                      "inactive_time": 7}})
    settings = cfg.settings_for("t")
    assert (settings.ttl, settings.dedup_window, settings.max_bytes, settings.retry_count,
            settings.retry_interval, settings.timeout, settings.inactive_time) == (
        1.0, 2.0, 3, 4, 5.0, 6.0, 7.0)
    assert type(settings.ttl) is float and type(settings.retry_count) is int


def test_policies_round_trip_through_to_dict_as_shards_receive_them() -> None:
    cfg = with_topics({"match": "a.>", "message": {"ttl": 5}, "subscriber": {"retry_count": 1}},
                      {"match": "b"})
    data = cfg.to_dict()
    assert data["topics"] == [{"match": "a.>", "message": {"ttl": 5.0},
                               "subscriber": {"retry_count": 1}}, {"match": "b"}]
    assert config.from_dict(data) == cfg
    assert config.from_dict(data).settings_for("a.x").ttl == 5.0
    assert cfg.replace({"message.ttl": 9}).topics == cfg.topics


def test_policies_load_from_a_file_and_set_still_changes_global_keys(tmp_path: Path) -> None:
    path = tmp_path / "flux.yaml"
    path.write_text("message:\n  ttl: 30\n"
                    "topics:\n"
                    "  - match: orders.*\n"
                    "    message:\n      ttl: 600\n"
                    "    subscriber:\n      timeout: 90\n")
    cfg = config.load(path, overrides=["message.ttl=5", "subscriber.timeout=4"])
    assert cfg.message.ttl == 5.0
    assert cfg.settings_for("orders.eu").ttl == 600.0
    assert cfg.settings_for("orders.eu").timeout == 90.0
    assert cfg.settings_for("billing").ttl == 5.0
    assert cfg.settings_for("billing").timeout == 4.0


def test_an_empty_topics_key_means_no_policies(tmp_path: Path) -> None:
    path = tmp_path / "flux.yaml"
    path.write_text("topics:\n")
    assert config.load(path).topics == ()
    assert Config().settings_for("anything") == Config().global_settings


@pytest.mark.parametrize("pattern", [
    "", "orders.", ".orders", "orders..eu", "orders.>.eu", "orders.e*", "or>", "orders eu",
    "orders.é", 5, None, "x" * 256,
])
def test_bad_patterns_are_refused_with_the_match_path(pattern: Any) -> None:
    refused("topics[1].match", [{"match": "ok"}, {"match": pattern}])


def test_a_policy_without_match_or_with_a_repeated_pattern_is_refused() -> None:
    refused("topics[0].match", [{"message": {"ttl": 5}}])
    error = refused("topics[2].match", [{"match": "a.*"}, {"match": "b"}, {"match": "a.*"}])
    assert "topics[0]" in error.problem


@pytest.mark.parametrize(("entry", "path"), [
    ({"match": "a", "message": {"ttl": -1}}, "topics[0].message.ttl"),
    ({"match": "a", "message": {"ttl": "long"}}, "topics[0].message.ttl"),
    ({"match": "a", "message": {"dedup_window": float("nan")}}, "topics[0].message.dedup_window"),
    ({"match": "a", "topic": {"max_bytes": 0}}, "topics[0].topic.max_bytes"),
    ({"match": "a", "subscriber": {"retry_count": 1.5}}, "topics[0].subscriber.retry_count"),
    ({"match": "a", "subscriber": {"retry_count": -1}}, "topics[0].subscriber.retry_count"),
    ({"match": "a", "subscriber": {"timeout": 0}}, "topics[0].subscriber.timeout"),
    ({"match": "a", "subscriber": {"retry_interval": True}},
     "topics[0].subscriber.retry_interval"),
    ({"match": "a", "subscriber": {"inactive_time": -5}}, "topics[0].subscriber.inactive_time"),
    ({"match": "a", "message": 5}, "topics[0].message"),
])
def test_bad_values_are_refused_with_their_path(entry: dict[str, Any], path: str) -> None:
    refused(path, [{"match": "z"}, entry] if path.startswith("topics[1]") else [entry])


@pytest.mark.parametrize(("entry", "path", "says"), [
    ({"match": "a", "storage": "tape"}, "topics[0].storage.kind", "'memory' or 'disk'"),
    ({"match": "a", "storage": {"max_bytes": -5}}, "topics[0].storage.max_bytes", ">= 0"),
    ({"match": "a", "storage": {"fsync": "never"}}, "topics[0].storage.fsync",
     "global key only"),
    ({"match": "a", "storage": "disk"}, "storage.dir", "need a data directory"),
    ({"match": "a", "message": {"max_delay": -5}}, "topics[0].message.max_delay", ">= 0"),
    ({"match": "a", "dead_letter": "yes"}, "topics[0].dead_letter.enabled", "true or false"),
    ({"match": "a", "dead_letter": {"ttl": -1}}, "topics[0].dead_letter.ttl", ">= 0"),
    ({"match": "a", "message": {"cleanup_time": 5}}, "topics[0].message.cleanup_time",
     "global key only"),
    ({"match": "a", "subscriber": {"heartbeat": 5}}, "topics[0].subscriber.heartbeat",
     "global key only"),
    ({"match": "a", "subscriber": {"max_in_flight": 5}},
     "topics[0].subscriber.max_in_flight", "global key only"),
    ({"match": "a", "topic": {"buffer": 5}}, "topics[0].topic.buffer", "global key only"),
    ({"match": "a", "message": {"tll": 5}}, "topics[0].message.tll", "unknown key"),
    ({"match": "a", "ttl": 5}, "topics[0].ttl", "unknown key"),
    ({"match": "a", "port": 5}, "topics[0].port", "unknown key"),
])
def test_keys_a_policy_may_not_set_are_refused_with_their_path(entry: dict[str, Any], path: str,
                                                               says: str) -> None:
    assert says in refused(path, [entry]).problem


def test_storage_policies_resolve_and_round_trip() -> None:
    cfg = config.from_dict({"storage": {"dir": "/data", "max_bytes": 10},
                        "topics": [{"match": "orders.>", "storage": "disk"},
                                   {"match": "logs.*", "storage": {"kind": "disk",
                                                                   "max_bytes": 99}}]})
    assert cfg.settings_for("orders.eu").storage == "disk"
    assert cfg.settings_for("orders.eu").storage_max_bytes == 10
    assert cfg.settings_for("logs.a").storage_max_bytes == 99
    assert cfg.settings_for("other").storage == "memory"
    assert cfg.to_dict()["topics"][0] == {"match": "orders.>", "storage": "disk"}
    assert config.from_dict(cfg.to_dict()) == cfg
    disk_default = config.from_dict({"storage": {"dir": "/data", "kind": "disk"}})
    assert disk_default.settings_for("x").storage == "disk"
    assert disk_default.settings_for("x").as_dict()["storage.kind"] == "disk"


def test_topics_must_be_a_list_of_mappings() -> None:
    refused("topics", {"match": "a"})
    refused("topics[0]", ["orders.*"])


def test_disk_topics_keep_inactive_subscriptions_storage_inactive_time_unless_a_policy_says() -> None:
    cfg = config.from_dict({
        "storage": {"dir": "/data", "kind": "disk", "inactive_time": 7 * 86400.0},
        "subscriber": {"inactive_time": 60.0},
        "topics": [{"match": "fast.*", "subscriber": {"inactive_time": 5.0}},
                   {"match": "mem.*", "storage": "memory"}]})
    assert cfg.settings_for("orders.eu").inactive_time == 7 * 86400.0
    assert cfg.settings_for("fast.eu").inactive_time == 5.0     # its policy says
    assert cfg.settings_for("mem.eu").inactive_time == 60.0     # a memory topic
    memory = config.from_dict({"topics": [{"match": "logs.*", "storage": "disk"}],
                                   "storage": {"dir": "/data"}})
    assert memory.settings_for("logs.eu").inactive_time == 604800.0   # the default: 7 days
    assert memory.settings_for("other").inactive_time == 300.0
