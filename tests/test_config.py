"""Broker configuration: DESIGN.md §2 defaults, YAML files, --set overrides, flags, validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from flux import config
from flux.config import Config
from flux.errors import ConfigError

# DESIGN.md §2, transcribed by hand: a default that drifts from the design fails here.
DESIGN_DEFAULTS: dict[str, Any] = {
    "port": 7070,
    "host": "127.0.0.1",
    "shards": "auto",
    "max_frame_bytes": 8388608,
    "topic": {"buffer": 1024, "max_bytes": 268435456},
    "message": {"ttl": 60, "cleanup_time": 5, "dedup_window": 120},
    "subscriber": {"retry_count": 5, "retry_interval": 1, "cleanup_time": 10, "timeout": 30,
                   "inactive_time": 300, "heartbeat": 5, "max_in_flight": 1000},
    "router": {"control_port": 0, "adopt_window": 5},
    "shard": {"ports": "auto", "advertise": [], "orphan_timeout": 60},
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flux.yaml"
    path.write_text(text)
    return path


def refused(path: str, *args: Any, **kwargs: Any) -> ConfigError:
    """Run config.load and return its ConfigError, checking it names ``path``."""
    with pytest.raises(ConfigError) as info:
        config.load(*args, **kwargs)
    assert info.value.path == path, str(info.value)
    assert path in str(info.value)
    return info.value


# -- defaults --------------------------------------------------------------------------


# keys added since the design (README, configuration table); topics: DESIGN.md §1
ADDED_DEFAULTS: dict[str, Any] = {
    "shard": {"max_memory": "auto"}, "topics": [],
    "storage": {"kind": "memory", "dir": None, "fsync": "always", "fsync_interval": 1.0,
                "segment_bytes": 67108864, "max_bytes": 0, "cache_bytes": 67108864,
                "reserved_bytes": 67108864, "inactive_time": 604800.0,
                "compaction_rate": 33554432},
    # DESIGN.md G13, "Why a connection may close"
    "limits": {"max_connections": 10000, "hello_timeout": 5.0, "max_subscriptions": 10000,
               "max_output_bytes": 16777216},
    "http": {"enabled": True, "host": "127.0.0.1", "port": "auto", "stats_interval": 2.0},
    # DESIGN.md G13 (users and permissions; off without users)
    "auth": {"users": [], "session_ttl": 600.0, "logins_per_minute": 30},
    "tls": {"cert": None, "key": None, "client_ca": None},
    "message": {"max_delay": 2592000.0},  # DESIGN.md G12
    "dead_letter": {"enabled": False, "ttl": 604800.0},  # DESIGN.md G11
}


def test_defaults_equal_design_section_2_plus_the_added_keys() -> None:
    expected = {key: ({**value, **ADDED_DEFAULTS.get(key, {})} if isinstance(value, dict)
                      else value) for key, value in DESIGN_DEFAULTS.items()}
    expected.update({key: value for key, value in ADDED_DEFAULTS.items()
                     if key not in DESIGN_DEFAULTS})
    assert Config().to_dict() == expected


def test_shard_max_memory_is_half_the_machine_per_shard_unless_set() -> None:
    assert Config().shard_max_memory(2) == config.physical_memory() // 4
    assert Config().replace({"shard.max_memory": 5_000_000}).shard_max_memory(2) == 5_000_000
    refused("shard.max_memory", overrides=["shard.max_memory=1G"])
    refused("shard.max_memory", overrides=["shard.max_memory=0"])


def test_storage_compaction_rate_is_a_byte_count_a_second_or_zero_for_no_cap() -> None:
    assert config.load(overrides=["storage.compaction_rate=0"]).storage.compaction_rate == 0
    assert config.load(overrides=["storage.compaction_rate=1048576"]).storage.compaction_rate \
        == 1048576
    refused("storage.compaction_rate", overrides=["storage.compaction_rate=-1"])
    refused("storage.compaction_rate", overrides=["storage.compaction_rate=fast"])


def test_defaults_table_equals_the_dataclass_defaults() -> None:
    assert Config().to_dict() == config.DEFAULTS


def test_load_without_file_overrides_or_flags_gives_the_defaults() -> None:
    assert config.load() == Config()
    assert config.from_dict({}) == Config()


def test_durations_are_floats_even_when_written_as_integers() -> None:
    cfg = config.load()
    assert type(cfg.message.ttl) is float and type(cfg.subscriber.heartbeat) is float


def test_shard_count_auto_is_the_usable_cpu_count() -> None:
    assert Config().shard_count == config.usable_cpus() >= 1
    assert Config(shards=3).shard_count == 3


# -- YAML files ------------------------------------------------------------------------


def test_yaml_file_sets_nested_and_top_level_keys(tmp_path: Path) -> None:
    path = write(tmp_path, """
port: 0
shards: 2
message:
  ttl: 0.5
subscriber:
  retry_count: 0
  max_in_flight: 1
shard:
  ports: [7101, 7102]
  advertise: ["10.0.0.1:7101", "10.0.0.1:7102"]
""")
    cfg = config.load(path)
    assert cfg.port == 0 and cfg.shards == 2
    assert cfg.message.ttl == 0.5
    assert cfg.message.dedup_window == 120.0  # untouched keys of a section keep their defaults
    assert cfg.subscriber.retry_count == 0 and cfg.subscriber.max_in_flight == 1
    assert cfg.shard.ports == (7101, 7102)
    assert cfg.shard.advertise == ("10.0.0.1:7101", "10.0.0.1:7102")


def test_empty_yaml_file_gives_the_defaults(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, "# nothing set\n")) == Config()


def test_missing_file_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    err = refused(str(missing), missing)
    assert "cannot read" in err.problem


def test_invalid_yaml_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port: [1,\n")
    assert "invalid YAML" in refused(str(path), path).problem


def test_yaml_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    refused("(root)", write(tmp_path, "- 1\n- 2\n"))


def test_unknown_key_in_file_is_refused_with_its_full_path(tmp_path: Path) -> None:
    err = refused("subscriber.retyr_count", write(tmp_path, "subscriber:\n  retyr_count: 3\n"))
    assert "retry_count" in err.problem  # the message lists the keys that do exist there


def test_unknown_top_level_key_in_file_is_refused(tmp_path: Path) -> None:
    refused("prot", write(tmp_path, "prot: 1\n"))


def test_section_given_a_scalar_is_refused(tmp_path: Path) -> None:
    refused("message", write(tmp_path, "message: 5\n"))


# -- --set overrides -------------------------------------------------------------------


def test_set_overrides_nested_keys() -> None:
    cfg = config.load(None, ["message.ttl=5", "subscriber.max_in_flight=1", "host=0.0.0.0"])
    assert cfg.message.ttl == 5.0 and cfg.subscriber.max_in_flight == 1 and cfg.host == "0.0.0.0"


@pytest.mark.parametrize(("text", "seconds"), [("0.25", 0.25), (".5", 0.5), ("1.5e+1", 15.0), ("3", 3.0)])
def test_set_accepts_fractional_durations(text: str, seconds: float) -> None:
    assert config.load(None, [f"subscriber.timeout={text}"]).subscriber.timeout == seconds


def test_set_accepts_yaml_lists() -> None:
    cfg = config.load(None, ["shards=2", "shard.ports=[7001, 7002]",
                             "shard.advertise=[127.0.0.1:9001, 127.0.0.1:9002]"])
    assert cfg.shard.ports == (7001, 7002)
    assert cfg.shard.advertise == ("127.0.0.1:9001", "127.0.0.1:9002")


def test_set_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 8000\nmessage:\n  ttl: 10\n")
    cfg = config.load(path, ["port=8001"])
    assert cfg.port == 8001 and cfg.message.ttl == 10.0


def test_later_set_wins_over_earlier_set() -> None:
    assert config.load(None, ["port=1", "port=2"]).port == 2


@pytest.mark.parametrize(("item", "path"), [
    ("subscriber.retyr_count=3", "subscriber.retyr_count"),
    ("nope=1", "nope"),
    ("nope.deeper=1", "nope"),
    ("message.ttl.x=1", "message.ttl.x"),
])
def test_set_of_an_unknown_key_is_refused_with_its_path(item: str, path: str) -> None:
    refused(path, None, [item])


@pytest.mark.parametrize("item", ["message.ttl", "=5", " =5"])
def test_set_without_key_and_value_is_refused(item: str) -> None:
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        config.load(None, [item])


def test_set_with_unparsable_value_is_refused_naming_the_key() -> None:
    refused("shard.ports", None, ["shard.ports=[1, 2"])


# -- flags -----------------------------------------------------------------------------


def test_flags_override_set_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 8000\nhost: 10.1.1.1\nshards: 4\n")
    cfg = config.load(path, ["port=8001", "host=10.2.2.2"], port=9000, host=None, shards=2)
    assert cfg.port == 9000  # flag beats --set and file
    assert cfg.host == "10.2.2.2"  # a None flag is "not given"
    assert cfg.shards == 2


def test_bad_flag_value_is_refused_with_its_key() -> None:
    refused("port", None, None, port=70000)


# -- bad values ------------------------------------------------------------------------

BAD_VALUES = [
    ("message.ttl", -1),
    ("message.ttl", "soon"),
    ("message.ttl", True),
    ("message.ttl", None),
    ("message.ttl", float("nan")),
    ("message.ttl", float("inf")),
    ("message.cleanup_time", 0),
    ("message.dedup_window", -0.5),
    ("subscriber.timeout", 0),
    ("subscriber.heartbeat", -5),
    ("subscriber.retry_interval", -1),
    ("subscriber.inactive_time", "1h"),
    ("subscriber.retry_count", -1),
    ("subscriber.retry_count", 1.5),
    ("subscriber.retry_count", "5"),
    ("subscriber.retry_count", True),
    ("subscriber.max_in_flight", 0),
    ("topic.buffer", 0),
    ("topic.max_bytes", "256MB"),
    ("max_frame_bytes", 100),
    ("port", 65536),
    ("port", -1),
    ("port", "7070"),
    ("port", False),
    ("router.control_port", 70000),
    ("router.adopt_window", -1),
    ("shard.orphan_timeout", 0),
    ("shards", 0),
    ("shards", "many"),
    ("shards", 2.0),
    ("host", ""),
    ("host", 17),
    ("shard.ports", "fixed"),
    ("shard.ports", []),
    ("shard.advertise", "10.0.0.1:7001"),
]


@pytest.mark.parametrize(("path", "value"), BAD_VALUES, ids=[f"{p}={v!r}" for p, v in BAD_VALUES])
def test_bad_value_is_refused_with_the_key_path(path: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Config().replace({path: value})
    assert info.value.path == path


@pytest.mark.parametrize(("path", "value"), BAD_VALUES, ids=[f"{p}={v!r}" for p, v in BAD_VALUES])
def test_bad_value_in_a_file_is_refused_with_the_key_path(tmp_path: Path, path: str, value: Any) -> None:
    section, _, key = path.rpartition(".")
    entry = {key: value}
    data = {section: entry} if section else entry
    file = tmp_path / "flux.yaml"
    file.write_text(yaml.safe_dump(data))
    refused(path, file)


def test_bool_for_an_int_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="expected an integer, got True"):
        Config().replace({"topic.buffer": True})


def test_negative_duration_message_says_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"must be >= 0, got -1"):
        Config().replace({"message.ttl": -1})


def test_port_list_entries_are_checked_with_their_index() -> None:
    err = refused("shard.ports[1]", None, ["shards=2", "shard.ports=[7001, 70000]"])
    assert "65535" in err.problem


@pytest.mark.parametrize("address", ["nohost", "h:", "h:port", "h:70000", 5])
def test_advertise_entries_must_be_host_port(address: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Config().replace({"shards": 2, "shard.advertise": ["h:1", address]})
    assert info.value.path == "shard.advertise[1]"


def test_shard_ports_length_must_match_shards() -> None:
    err = refused("shard.ports", None, ["shards=3", "shard.ports=[7001, 7002]"])
    assert "2 ports for 3 shards" in err.problem


def test_shard_advertise_length_must_match_shards() -> None:
    refused("shard.advertise", None, ["shards=1", "shard.advertise=[a:1, b:2]"])


def test_zero_is_allowed_where_it_means_off_or_any() -> None:
    cfg = Config().replace({"port": 0, "message.ttl": 0, "message.dedup_window": 0,
                            "subscriber.retry_interval": 0, "subscriber.retry_count": 0,
                            "router.adopt_window": 0})
    assert (cfg.port, cfg.message.ttl, cfg.subscriber.retry_count) == (0, 0.0, 0)


# -- replace and to_dict ---------------------------------------------------------------


def test_replace_applies_dotted_paths_and_leaves_the_original_alone() -> None:
    base = Config()
    cfg = base.replace({"message.ttl": 5, "subscriber.heartbeat": 0.5})
    assert cfg.message.ttl == 5.0 and cfg.subscriber.heartbeat == 0.5
    assert base.message.ttl == 60.0


def test_replace_accepts_keyword_overrides() -> None:
    assert Config().replace(port=0, **{"topic.buffer": 8}).topic.buffer == 8


def test_replace_refuses_unknown_keys_with_their_path() -> None:
    with pytest.raises(ConfigError) as info:
        Config().replace({"message.tll": 5})
    assert info.value.path == "message.tll"
    with pytest.raises(ConfigError) as info:
        Config().replace({"mesage.ttl": 5})
    assert info.value.path == "mesage"


def test_config_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().port = 1  # type: ignore[misc]


@pytest.mark.parametrize("changes", [
    {},
    {"port": 0, "shards": 2, "shard.ports": [7001, 7002], "shard.advertise": ["a:1", "b:2"]},
    {"message.ttl": 0.25, "subscriber.retry_count": 0, "topic.max_bytes": 1 << 40},
])
def test_to_dict_round_trips_through_from_dict(changes: dict[str, Any]) -> None:
    cfg = Config().replace(changes)
    data = cfg.to_dict()
    assert config.from_dict(data) == cfg
    assert isinstance(data["shard"]["advertise"], list)


def test_to_dict_is_plain_data_that_yaml_can_write_and_load_back(tmp_path: Path) -> None:
    cfg = Config().replace({"shards": 2, "shard.ports": [7001, 7002]})
    path = tmp_path / "dumped.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert config.load(path) == cfg


def test_readme_configuration_table_lists_every_key_with_its_default() -> None:
    """The README's configuration reference is complete and its defaults are the real ones."""
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| `([^`]*)` \|", section, re.MULTILINE))

    def flat(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in data.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                text = f"{value:.15g}" if isinstance(value, float) else str(value)
                out[f"{prefix}{key}"] = text.lower() if isinstance(value, bool) else text
        return out

    assert rows == flat(Config().to_dict())


@pytest.mark.parametrize(("item", "path"), [
    ("limits.max_connections=0", "limits.max_connections"),
    ("limits.hello_timeout=0", "limits.hello_timeout"),
    ("limits.hello_timeout=soon", "limits.hello_timeout"),
    ("limits.max_subscriptions=-1", "limits.max_subscriptions"),
    ("limits.max_output_bytes=1000", "limits.max_output_bytes"),
    ("limits.bogus=1", "limits.bogus"),
])
def test_limits_are_refused_at_start_with_their_path(item: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(overrides=[item])
    assert info.value.path == path


def test_max_output_bytes_must_hold_two_frames() -> None:
    ok = config.load(overrides=["max_frame_bytes=65536", "limits.max_output_bytes=131072"])
    assert ok.limits.max_output_bytes == 131072
    with pytest.raises(ConfigError, match="2 x max_frame_bytes"):
        config.load(overrides=["max_frame_bytes=65536", "limits.max_output_bytes=131071"])
