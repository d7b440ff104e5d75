"""G13 on the shard core: HELLO's identity, per-item permissions, STATS, reloads."""

from __future__ import annotations

from typing import Any

from flux import errors
from flux import protocol as P
from flux.auth import sessions
from flux.auth.credentials import hash_password, token_digest
from flux.auth.users import parse_auth
from tests.test_core_support import OK, Shard

SECRET = "ab" * 32
ALICE, BOB, ROOT = "alice-token", "bob-token", "root-token"
USERS: list[dict[str, Any]] = [
    {"name": "alice", "token_sha256": token_digest(ALICE),
     "publish": {"allow": ["orders.>"], "deny": ["orders.secret"]},
     "subscribe": ["orders.*"]},
    {"name": "bob", "token_sha256": token_digest(BOB), "subscribe": ["metrics.>"]},
    {"name": "carol", "password": hash_password("pw", n=2), "publish": ["orders.eu"]},
    {"name": "root", "token_sha256": token_digest(ROOT), "publish": [">"],
     "subscribe": [">"], "admin": [">"]},
]


def shard(users: list[dict[str, Any]] = USERS) -> Shard:
    s = Shard({"auth.users": users})
    s.core.secret = SECRET
    return s


def hello(s: Shard, **credentials: Any) -> tuple[Any, list[Any]]:
    client = s.connect()
    reply = client.request([P.HELLO, client.rid(), {"version": P.VERSION, **credentials}])
    return client, reply


def code(frame: list[Any]) -> int:
    assert frame[0] == P.ERROR, frame
    return int(frame[2])


def test_hello_with_a_known_token_names_the_user() -> None:
    _, reply = hello(shard(), token=ALICE)
    assert reply[0] == P.HELLO_OK and reply[2]["user"] == "alice"


def test_failed_authentication_is_a_typed_error_then_the_connection_closes() -> None:
    s = shard()
    for credentials in ({}, {"token": "nope"}, {"user": "carol", "password": "pw"},
                        {"session": b"x" * 40}, {"token": 17}):
        client, reply = hello(s, **credentials)
        assert code(reply) == errors.AuthenticationFailed.code, credentials
        assert client.closed


def test_requests_before_hello_are_not_authorized_and_change_nothing() -> None:
    s = shard()
    client = s.connect()
    reply = client.publish_frame([["orders.eu", ["a"], [b"x"]]])
    assert code(reply) == errors.NotAuthorized.code
    assert "orders.eu" not in s.core.topics and not client.closed
    assert client.ping()[0] == P.PONG


def test_each_group_of_a_publish_is_checked_and_only_the_allowed_are_stored() -> None:
    s = shard()
    client, _ = hello(s, token=ALICE)
    rows = client.publish_rows([["orders.eu", "1", b"a"], ["orders.secret", "2", b"b"],
                                ["metrics.cpu", "3", b"c"], ["orders.us", "4", b"d"]])
    assert [r[0] for r in rows] == [OK, errors.NotAuthorized.code, errors.NotAuthorized.code,
                                    OK]
    assert sorted(s.core.topics) == ["orders.eu", "orders.us"]


def test_subscribe_fetch_and_commit_need_subscribe_permission() -> None:
    s = shard()
    root, _ = hello(s, token=ROOT)
    root.publish_one("m", topic="metrics.cpu")
    alice, _ = hello(s, token=ALICE)
    assert code(alice.subscribe_frame(1, topic="metrics.cpu")) == errors.NotAuthorized.code
    assert code(alice.fetch(topic="metrics.cpu")) == errors.NotAuthorized.code
    assert code(alice.commit("n", 0, topic="metrics.cpu")) == errors.NotAuthorized.code
    assert not s.core.topics["metrics.cpu"].subs
    bob, _ = hello(s, token=BOB)
    assert bob.fetch(topic="metrics.cpu")[0] == P.FETCHED
    assert bob.subscribe(1, topic="metrics.cpu", read_old=True)["created"]


def test_stats_lists_only_topics_a_non_admin_may_use() -> None:
    s = shard()
    root, _ = hello(s, token=ROOT)
    root.publish_one("a", topic="metrics.cpu")
    root.publish_one("b", topic="orders.eu")
    bob, _ = hello(s, token=BOB)
    assert list(bob.request([P.STATS, bob.rid()])[2]["topics"]) == ["metrics.cpu"]
    assert sorted(root.request([P.STATS, root.rid()])[2]["topics"]) == ["metrics.cpu",
                                                                          "orders.eu"]


def test_a_session_token_opens_a_shard_until_it_expires() -> None:
    s = shard()
    user = s.core.auth.by_name["carol"]  # type: ignore[union-attr]
    token = sessions.issue(SECRET, "carol", user.fingerprint, s.core.epoch + 10)
    _, reply = hello(s, session=token)
    assert reply[2]["user"] == "carol"
    forged = sessions.issue("cd" * 32, "root", b"", s.core.epoch + 10)
    assert code(hello(s, session=forged)[1]) == errors.AuthenticationFailed.code
    s.advance(11)
    assert code(hello(s, session=token)[1]) == errors.SessionExpired.code


def test_reload_keeps_allowed_sessions_ends_revoked_subscriptions_and_closes_the_gone() -> None:
    s = shard()
    alice, _ = hello(s, token=ALICE)
    alice.subscribe(1, topic="orders.eu")
    bob, _ = hello(s, token=BOB)
    users = [dict(USERS[0], subscribe=[], publish=["orders.eu"]), USERS[3]]
    s.core.reload_auth(parse_auth({"users": users}), s.now)
    s.collect()
    ended = alice.take(P.SUB_ENDED)
    assert ended and ended[0][2] == errors.NotAuthorized.code
    assert not alice.closed
    assert alice.publish_rows([["orders.eu", "x", b"x"], ["orders.us", "y", b"y"]])[1][0] \
        == errors.NotAuthorized.code
    assert bob.closed and code(bob.take(P.ERROR)[0]) == errors.AuthenticationFailed.code


def test_turning_auth_off_by_reload_allows_everything() -> None:
    s = shard()
    bob, _ = hello(s, token=BOB)
    s.core.reload_auth(parse_auth({}), s.now)
    assert bob.publish_rows([["orders.eu", "x", b"x"]])[0][0] == OK


def test_a_dead_letter_topic_is_read_with_subscribe_or_admin_on_its_source() -> None:
    users = [*USERS, {"name": "ops", "token_sha256": token_digest("ops-token"),
                      "admin": ["orders.>"]}]
    s = shard(users)
    for token, allowed in ((ALICE, True), ("ops-token", True), (BOB, False)):
        client, _ = hello(s, token=token)
        reply = client.fetch(topic="orders.eu~billing", offset=0)
        assert (reply[0] == P.FETCHED) == allowed, (token, reply)
        if not allowed:
            assert code(reply) == errors.NotAuthorized.code
    client, _ = hello(s, token=ROOT)
    reply = client.publish_frame([["orders.eu~billing", ["x"], [b"x"]]])
    assert reply[3][0][2][0][1] == errors.InvalidTopic.code  # nobody publishes there
