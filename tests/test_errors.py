"""The error tree: wire codes, retryable flags, from_code and the extra fields errors keep.

The table is the one PROTOCOL.md publishes ("Error codes"); a code that changes
breaks every client that maps it.
"""

from __future__ import annotations

import pytest

from flux import errors

# code -> (class, retryable), as PROTOCOL.md lists them
REMOTE_CODES: dict[int, tuple[type[errors.RemoteError], bool]] = {
    10: (errors.ProtocolError, False),
    11: (errors.FrameTooLarge, False),
    12: (errors.UnsupportedVersion, False),
    13: (errors.HelloTimeout, False),
    20: (errors.InvalidRequest, False),
    21: (errors.InvalidTopic, False),
    22: (errors.InvalidMessageId, False),
    23: (errors.MessageTooLarge, False),
    24: (errors.InvalidKey, False),
    25: (errors.InvalidHeaders, False),
    26: (errors.InvalidDelay, False),
    30: (errors.WrongShard, True),
    40: (errors.TopicFull, True),
    41: (errors.Busy, True),
    42: (errors.StorageUnavailable, True),
    50: (errors.TopicReset, False),
    60: (errors.UnknownSubscription, False),
    61: (errors.SubscriptionInactive, False),
    62: (errors.SubscriptionTakenOver, False),
    63: (errors.NotDelivered, False),
    64: (errors.OffsetOutOfRange, False),
    65: (errors.SubscriptionKindMismatch, False),
    70: (errors.ShuttingDown, True),
    80: (errors.NotAuthorized, False),
    81: (errors.TooManyConnections, True),
    82: (errors.TooManySubscriptions, False),
    83: (errors.SlowConsumer, True),
    84: (errors.AuthenticationFailed, False),
    85: (errors.SessionExpired, True),
    86: (errors.TooManyLogins, True),
}
LOCAL_CODES: dict[int, tuple[type[errors.LocalError], bool]] = {
    100: (errors.ConnectionLost, True),
    101: (errors.RequestTimeout, True),
    102: (errors.RetryDeadlineExceeded, False),
    110: (errors.ConfigError, False),
    120: (errors.ClientClosed, False),
    130: (errors.DataLoss, False),
}


def all_subclasses(cls: type) -> list[type]:
    out, stack = [], [cls]
    while stack:
        c = stack.pop()
        for sub in c.__subclasses__():
            out.append(sub)
            stack.append(sub)
    return out


def test_every_remote_error_class_has_a_code_in_the_published_table() -> None:
    published = {cls for cls, _ in REMOTE_CODES.values()}
    assert set(all_subclasses(errors.RemoteError)) == published


def test_every_local_error_class_has_a_code_in_the_published_table() -> None:
    assert set(all_subclasses(errors.LocalError)) == {cls for cls, _ in LOCAL_CODES.values()}


def test_codes_are_unique_across_all_error_classes() -> None:
    classes = all_subclasses(errors.FluxError)
    codes = [c.code for c in classes if c not in (errors.RemoteError, errors.LocalError)]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize("code", sorted(REMOTE_CODES | LOCAL_CODES))
def test_each_error_class_has_its_published_code_and_retryable_flag(code: int) -> None:
    cls, retryable = (REMOTE_CODES | LOCAL_CODES)[code]
    assert cls.code == code
    assert cls.retryable is retryable


@pytest.mark.parametrize("code", sorted(REMOTE_CODES))
def test_from_code_maps_each_remote_code_back_to_its_class(code: int) -> None:
    exc = errors.from_code(code, "what happened", {"topic": "a"})
    assert type(exc) is REMOTE_CODES[code][0]
    assert str(exc) == "what happened"
    assert exc.details == {"topic": "a"}


@pytest.mark.parametrize("code", [0, 1, 99, 100, 110, 999, -5])
def test_from_code_maps_unknown_and_local_codes_to_plain_remote_error(code: int) -> None:
    exc = errors.from_code(code, "strange")
    assert type(exc) is errors.RemoteError
    assert str(exc) == "strange"


def test_from_code_builds_topic_reset_with_old_and_new_generations() -> None:
    exc = errors.from_code(50, "reset", {"old": 7, "new": 9, "topic": "a"})
    assert isinstance(exc, errors.TopicReset)
    assert (exc.old, exc.new) == (7, 9)
    assert exc.details["topic"] == "a"


def test_topic_reset_without_message_names_both_generations() -> None:
    assert str(errors.TopicReset(old=1, new=2)) == "topic reset: generation 1 -> 2"


def test_error_without_message_uses_its_class_docstring() -> None:
    assert str(errors.Busy()) == errors.Busy.__doc__


def test_error_keeps_its_details() -> None:
    exc = errors.FrameTooLarge("too big", size=10, limit=5)
    assert exc.details == {"size": 10, "limit": 5}
    assert exc.message == "too big"


def test_config_error_names_the_path_and_the_problem() -> None:
    exc = errors.ConfigError("subscriber.timeout", "must be > 0, got -1")
    assert (exc.path, exc.problem) == ("subscriber.timeout", "must be > 0, got -1")
    assert str(exc) == "config subscriber.timeout: must be > 0, got -1"


def test_remote_and_local_errors_are_separate_branches_of_flux_error() -> None:
    for cls, _ in REMOTE_CODES.values():
        assert issubclass(cls, errors.RemoteError) and not issubclass(cls, errors.LocalError)
    for cls, _ in LOCAL_CODES.values():
        assert issubclass(cls, errors.LocalError) and not issubclass(cls, errors.RemoteError)


def test_framing_errors_are_protocol_errors() -> None:
    assert issubclass(errors.FrameTooLarge, errors.ProtocolError)
    assert issubclass(errors.UnsupportedVersion, errors.ProtocolError)


def test_request_validation_errors_are_invalid_requests() -> None:
    for cls in (errors.InvalidTopic, errors.InvalidMessageId, errors.MessageTooLarge):
        assert issubclass(cls, errors.InvalidRequest)
