"""The permission model (G13): the pattern matcher against a reference, a matrix of users x
operations x topics, credentials, session tokens and the auth section's validation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux import errors
from flux.auth import sessions
from flux.auth.credentials import hash_password, token_digest, verify_password
from flux.auth.permissions import Permissions, Rule
from flux.auth.users import parse_auth
from flux.client.credentials import Credentials, split_url
from flux.config import Config

TOKENS = st.sampled_from(["a", "b", "orders", "eu"])
PATTERN_TOKENS = st.sampled_from(["a", "b", "orders", "eu", "*"])


def reference(pattern: str, topic: str) -> bool:
    """A pattern as a regular expression: '*' one token, a final '>' one or more."""
    parts = pattern.split(".")
    tail = ""
    if parts[-1] == ">":
        parts, tail = parts[:-1], r"[^.]+(\.[^.]+)*"
    regex = r"\.".join("[^.]+" if p == "*" else re.escape(p) for p in parts)
    if tail:
        regex = f"{regex}\\.{tail}" if regex else tail
    return re.fullmatch(regex, topic) is not None


@st.composite
def patterns(draw: Any) -> str:
    tokens = draw(st.lists(PATTERN_TOKENS, min_size=1, max_size=4))
    if draw(st.booleans()):
        tokens = [*tokens[:3], ">"]
    return ".".join(tokens)


topics = st.lists(TOKENS, min_size=1, max_size=5).map(".".join)


@given(allow=st.lists(patterns(), max_size=3), deny=st.lists(patterns(), max_size=3),
       topic=topics)
def test_a_rule_decides_as_the_reference_says(allow: list[str], deny: list[str],
                                              topic: str) -> None:
    expected = (not any(reference(p, topic) for p in deny)
                and any(reference(p, topic) for p in allow))
    rule = Rule(tuple(allow), tuple(deny))
    assert rule.decide(topic) is expected
    permissions = Permissions(rule, rule, rule)
    assert permissions.may("publish", topic) is expected
    assert permissions.may("publish", topic) is expected  # cached: the same answer


ALICE = {"name": "alice", "token_sha256": token_digest("a"),
         "publish": {"allow": ["orders.>"], "deny": ["orders.secret"]},
         "subscribe": ["orders.*", "audit.>"], "admin": ["orders.eu"]}
BOB = {"name": "bob", "token_sha256": token_digest("b"), "subscribe": {"allow": [">"],
                                                                      "deny": ["audit.>"]}}
ROOT = {"name": "root", "token_sha256": token_digest("r"), "publish": [">"],
        "subscribe": [">"], "admin": [">"]}
NOBODY = {"name": "nobody", "token_sha256": token_digest("n")}
TOPICS = ["orders.eu", "orders.secret", "orders.eu.x", "audit.log", "metrics"]
# users x operations x topics: every expected outcome (1 allowed, 0 refused)
MATRIX = {
    ("alice", "publish"): [1, 0, 1, 0, 0],
    ("alice", "subscribe"): [1, 1, 0, 1, 0],
    ("alice", "admin"): [1, 0, 0, 0, 0],
    ("bob", "publish"): [0, 0, 0, 0, 0],
    ("bob", "subscribe"): [1, 1, 1, 0, 1],
    ("bob", "admin"): [0, 0, 0, 0, 0],
    ("root", "publish"): [1, 1, 1, 1, 1],
    ("root", "subscribe"): [1, 1, 1, 1, 1],
    ("root", "admin"): [1, 1, 1, 1, 1],
    ("nobody", "publish"): [0, 0, 0, 0, 0],
    ("nobody", "subscribe"): [0, 0, 0, 0, 0],
    ("nobody", "admin"): [0, 0, 0, 0, 0],
}


@pytest.mark.parametrize(("user", "operation"), list(MATRIX))
def test_permission_matrix(user: str, operation: str) -> None:
    auth = parse_auth({"users": [ALICE, BOB, ROOT, NOBODY]})
    permissions = auth.permissions[user]
    got = [int(permissions.may(operation, topic)) for topic in TOPICS]
    assert got == MATRIX[(user, operation)]
    assert permissions.broker_admin is (user == "root")


def test_passwords_are_stored_as_scrypt_and_verified() -> None:
    stored = hash_password("s3cret", n=16)
    assert stored.startswith("scrypt$16$8$1$") and "s3cret" not in stored
    assert verify_password("s3cret", stored)
    assert not verify_password("S3cret", stored)
    assert not verify_password("s3cret", "scrypt$16$8$1$bad")
    assert hash_password("s3cret", n=16) != stored  # a fresh salt each time


def test_session_tokens_are_signed_and_expire() -> None:
    secret = "11" * 32
    token = sessions.issue(secret, "alice", b"fp", 100.0)
    assert sessions.read(secret, token, 99.0) == ("alice", b"fp")
    with pytest.raises(errors.SessionExpired):
        sessions.read(secret, token, 100.0)
    tampered = token[:-40] + bytes([token[-40] ^ 1]) + token[-39:]
    for bad in (tampered, b"short", "text", None):
        with pytest.raises(errors.AuthenticationFailed):
            sessions.read(secret, bad, 0.0)
    with pytest.raises(errors.AuthenticationFailed):
        sessions.read("22" * 32, token, 0.0)


@pytest.mark.parametrize(("auth", "path"), [
    ({"users": [{"name": "x"}]}, "auth.users[0]"),
    ({"users": [{"name": "x", "token_sha256": "abc"}]}, "auth.users[0].token_sha256"),
    ({"users": [{"name": "x", "password": "plain"}]}, "auth.users[0].password"),
    ({"users": [{"name": "x", "token_sha256": "0" * 64, "publish": ["a..b"]}]},
     "auth.users[0].publish"),
    ({"users": [{"name": "x", "token_sha256": "0" * 64, "admin": {"alow": [">"]}}]},
     "auth.users[0].admin"),
    ({"users": [{"name": "x", "token_sha256": "0" * 64, "colour": 1}]},
     "auth.users[0].colour"),
    ({"users": [{"name": "x", "token_sha256": "0" * 64},
                {"name": "x", "token_sha256": "1" * 64}]}, "auth.users[1].name"),
    ({"session_ttl": 0}, "auth.session_ttl"),
    ({"logins_per_minute": "many"}, "auth.logins_per_minute"),
    ({"user": []}, "auth.user"),
])
def test_bad_auth_sections_are_refused_with_their_path(auth: dict[str, Any], path: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        Config().replace({"auth": auth})
    assert info.value.path == path


def test_the_auth_section_round_trips_through_the_config() -> None:
    config = Config().replace({"auth": {"users": [ALICE, ROOT], "session_ttl": 30}})
    assert Config().replace({"auth": config.to_dict()["auth"]}) == config
    assert config.auth.enabled and not Config().auth.enabled


def test_credentials_come_from_the_url_or_the_arguments() -> None:
    assert split_url("flux://h:1") == ("h:1", None)
    assert split_url("flux://al%40x:p%3Aw@h:1") == ("h:1", Credentials(user="al@x",
                                                                        password="p:w"))
    assert split_url("flux://h:1?token=t")[1] == Credentials(token="t")
    assert split_url("flux://u:p@h:1", token="t")[1] == Credentials(token="t")
    assert "p" not in repr(Credentials(user="u", password="p"))
    with pytest.raises(ValueError):
        split_url("flux://h:1", user="u")
    with pytest.raises(ValueError):
        split_url("http://h:1")


def test_flux_auth_prints_a_password_hash_and_a_token_with_its_digest() -> None:
    from click.testing import CliRunner

    from flux.cli import main

    runner = CliRunner()
    done = runner.invoke(main, ["auth", "hash"], input="s3cret\n")
    assert done.exit_code == 0, done.output
    stored = done.output.strip()
    assert verify_password("s3cret", stored) and not verify_password("other", stored)
    Config().replace({"auth": {"users": [{"name": "u", "password": stored}]}})  # it loads
    done = runner.invoke(main, ["auth", "token"])
    lines = dict(line.split(": ", 1) for line in done.output.strip().splitlines())
    assert token_digest(lines["token"]) == lines["token_sha256"]
