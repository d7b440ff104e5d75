"""The ``http`` config keys: defaults, the ``auto`` port, and refusals naming the key."""

from __future__ import annotations

import pytest

from flux import config
from flux.config import Config
from flux.errors import ConfigError


def test_http_is_on_by_default_on_loopback_at_port_plus_1000() -> None:
    cfg = Config()
    assert cfg.http.enabled is True
    assert cfg.http.host == "127.0.0.1"
    assert cfg.http_port == 8070


def test_auto_http_port_is_any_free_port_when_the_router_port_is_0_or_near_the_top() -> None:
    assert config.load(port=0).http_port == 0
    assert config.load(port=65000).http_port == 0
    assert config.load(port=7170).http_port == 8170


def test_explicit_http_port_and_host_are_kept() -> None:
    cfg = config.load(overrides=["http.port=0", "http.host=::1", "http.enabled=false",
                                 "http.stats_interval=0.25"])
    assert (cfg.http_port, cfg.http.host, cfg.http.enabled) == (0, "::1", False)
    assert cfg.http.stats_interval == 0.25
    assert config.from_dict(cfg.to_dict()) == cfg  # shards get the config as plain data


@pytest.mark.parametrize(("item", "path"), [
    ("http.port=70000", "http.port"),
    ("http.port=-1", "http.port"),
    ("http.port=any", "http.port"),
    ("http.enabled=maybe", "http.enabled"),
    ("http.enabled=1", "http.enabled"),
    ("http.host=", "http.host"),
    ("http.stats_interval=0", "http.stats_interval"),
    ("http.stats_interval=-2", "http.stats_interval"),
    ("http.prot=1", "http.prot"),
])
def test_bad_http_values_are_refused_naming_the_key(item: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(overrides=[item])
    assert info.value.path == path
