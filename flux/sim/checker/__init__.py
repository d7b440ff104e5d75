"""The checker: one pass over a whole history, every violation of G1-G7 named.

Jepsen-style accounting of every published message (acked, delivered, lost and
whether a crash explains it) plus Flux's own rules: order, dedup, redelivery
schedule, cleanup, subscription lifetime, the pull path's pages and cursors, and
liveness once faults heal. Shared
by the simulator and chaos runs; it reads only :mod:`flux.sim.history` data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flux.sim.checker.index import Index, Params
from flux.sim.history import History

__all__ = ["RULES", "Params", "Report", "Violation", "check"]

# Every rule the checker can report, ``guarantee/rule`` -> what it asserts. Report.add
# refuses any other id, so a misspelt rule cannot hide; `flux sim --rule-stats` lists
# them all; tests/sim/planted.py has a planted bug that trips each one.
RULES: dict[str, str] = {
    # publish.py: what was stored
    "G1/offset-reused": "one offset of a generation never holds two message ids",
    "G2/unexpected": "every delivered or consumed message was published",
    "G3/stored-twice": "a message id is stored at one offset per generation within dedup_window",
    "G3/duplicate-flag": "a second ack at the same offset carries duplicate=True",
    "G7/restart-without-cause": "a shard changes generation only when a fault explains it",
    "G7/two-incarnations": "two generations of one shard index are never up at once",
    # delivery.py: pushes and acks per subscription
    "G1/window": "the shard grants at most the max_in_flight asked (and its cap), and"
                  " never has more unacked first pushes out",
    "G1/order": "a session's first deliveries come in strictly increasing offset order"
                " (topics without delayed messages: G12/due-order for the others)",
    "G1/redelivered-acked": "a message is not pushed after the shard confirmed its ack",
    "G1/ack-refused": "an ack of an offset delivered to the live session is not refused"
                      " as NotDelivered",
    "G4/attempt-numbering": "a redelivery's attempt number is one more than the last push's",
    "G4/too-many-pushes": "a message is pushed at most 1 + retry_count times",
    "G4/redelivered-after-ack": "a message is not pushed again after its ack was sent",
    "G4/early-redelivery": "push k comes no earlier than t0 + k*(timeout + retry_interval)",
    "G4/late-redelivery": "push k comes no later than t0 + k*(timeout + retry_interval)",
    "G4/missed-redelivery": "an unacked message is pushed again (or the subscription made"
                            " inactive) when due",
    "G4/spurious-inactive": "SubscriptionInactive only after a message used all its pushes",
    "G6/cursor-moved-back": "a push subscription's cursor (SUBSCRIBED, ACKED) never moves"
                            " below one confirmed earlier",
    "G6/below-start": "nothing below a subscription's start offset is delivered",
    "G6/dropped-without-cause": "the broker never cuts a healthy session (no fault near)",
    "G7/generations-mixed": "a session gets deliveries of its own generation only",
    # retention.py: what the broker deletes
    "G5/deleted-before-ttl": "a message is deleted only after message.ttl",
    "G5/deleted-unacked": "a message is deleted only once every subscription acked it",
    "G6/deleted-without-cause": "an ephemeral subscription is deleted only when its"
                                " session ends",
    "G6/deleted-too-early": "a named subscription is deleted only inactive_time after its"
                            " last session was attached",
    "G6/kept-too-long": "an inactive subscription is deleted by inactive_time + cleanup_time",
    # starts.py: where a new subscription starts
    "G7/reset-start": "on_reset=earliest restarts at offset 0 of the new generation",
    "G5/start-past-held": "read_old / from_offset start at or below a message still held"
                          " (stored less than ttl before)",
    "G6/start-before-asked": "a from_offset subscription never starts below that offset",
    "G6/start-above-held": "read_old / from_offset start at or below every message held at"
                           " or above the offset asked for, kept delayed ones included",
    "G6/start-not-next": "the default start is past every offset acked before the subscribe",
    "G6/start-past-new": "a new subscription does not start past a message published after it",
    # liveness.py: once faults heal
    "liveness/never-subscribed": "every live subscriber has a subscription at the end",
    "liveness/stale-generation": "every live subscriber follows its shard to its latest"
                                 " generation",
    "G2/lost": "every live subscription gets every message acked in its final generation"
               " from its start on",
    "liveness/publish-stuck": "a publish made after the heal is acked",
    # pull.py: FETCH and COMMIT
    "G6/commit-not-applied": "a COMMIT moves the cursor to at least its offset",
    "G7/fetch-generation": "a FETCH of one generation is never answered from another",
    "G1/fetch-range": "a page starts at max(offset, oldest) and ends by next",
    "G2/fetch-empty": "a page of a held, non-empty range is not empty",
    "G1/fetch-next": "a page's next is past every offset acked before the FETCH was sent",
    "G1/fetch-id": "a page reads each offset as the message id stored there",
    "G2/fetch-unexpected": "every message a page holds was published",
    "G6/commit-moved-back": "a pull cursor a COMMITTED reports is not below an earlier one",
    "G6/resume-below-commit": "a pull subscription resumes at or above the cursor committed",
    "G5/fetch-skipped": "a page never skips offsets its pull subscription had not"
                        " committed past",
    "liveness/pull-behind": "a live pull reader commits up to the end of what was acked",
    # the blind spots of issue 20
    "G1/repush-order": "the k-th pushes of one session arrive in increasing offset order"
                       " (topics without delayed messages)",
    "G6/cursor-past-unacked": "a push cursor (SUBSCRIBED, ACKED) never passes an offset no"
                              " ack was sent for",
    "G6/cursor-past-commit": "a pull cursor is at most its start or the highest COMMIT sent",
    # calls.py: the user-level publish call
    "G3/call-stored-twice": "a message of a call with client-chosen ids is stored once per"
                            " generation",
    "G2/call-ack-mismatch": "a call returns acks for its own messages, in order",
    "G3/full-before-dedup": "a publish whose id was stored in the window is never refused"
                            " TopicFull",
    "G5/gone-before-ttl": "every offset below a reply's oldest was held for message.ttl",
    "G5/gone-unacked": "every offset below a reply's oldest was acked by each subscription"
                       " that held it",
    "G4/left-unacked": "a live subscription acks, by the end, every message of its final"
                       " generation from its start on (unacked ones are pushed again)",
    # durable.py: G9 (disk topics; the per-generation rules above span their restarts)
    "G9/generation-kept": "a disk topic keeps its generation across shard crashes unless"
                          " a power loss or damage explains a new one",
    "G9/trim-undone": "a disk topic's message cleanup deleted (a trim, or a kept delayed"
                      " message released) stays deleted across restarts of its shard",
    "G9/payload-changed": "every message delivered or fetched carries the payload its id"
                          " was published with",
    "G9/storage-failed-unexplained": "a shard's log fails (and the shard exits) only after"
                                     " an fsync error or damage on its machine, never for"
                                     " a full disk",
    # delayed.py: G12 and the message keys and headers
    "G12/pushed-early": "a delayed message is pushed no earlier than its delay after the"
                        " first attempt to publish it",
    "G12/due-order": "a session's first pushes of a topic that carries delayed messages"
                     " come in (due time, offset) order",
    "G12/cleanup-held-back": "a message acked by every subscription is deleted within two"
                             " cleanup periods of ttl after it was published and due,"
                             " whatever delayed message is pending (memory and disk topics)",
    "G2/meta-changed": "every message delivered or fetched carries the key and headers its"
                       " id was published with",
    # shared.py: G10 (shared subscriptions)
    "G10/held-twice": "a message, and with key_ordered a key, is held by one member of a"
                      " shared subscription at a time",
    "G10/key-order": "a key's first pushes to a key-ordered shared subscription go out in"
                     " offset order",
    "G10/push-count": "a message's push count grows across members: no attempt number"
                      " twice",
    "G10/ack-not-held": "an ack counts only from the member holding the message",
    # dead_letters.py: G11 (nak, term, in_progress and dead-letter topics)
    "G11/dead-letter-record": "a dead letter carries its message's id, payload, key and"
                              " headers, in its subscription's dead-letter topic, with an"
                              " exhausted or term reason",
    "G11/dead-letter-missing": "a message termed with a dead-letter policy is in the"
                               " dead-letter topic",
    "G11/dead-letter-pushed": "a dead-lettered message is never pushed to its subscription"
                              " afterwards",
    "G11/termed-pushed": "a termed message is never pushed again to its subscription",
    "G11/exhausted-not-dead-lettered": "with a dead-letter policy, a message out of pushes"
                                       " goes to the dead-letter topic: the session is not"
                                       " made inactive",
    "G11/nak-early": "a nak'd message is not pushed again before t_nak + delay",
    # bad_input.py: G8
    "G8/untyped-error": "a bad request gets an error of a class a caller can act on",
    "G8/batch-item": "each item of a PUBLISH gets its own result: valid ones stored,"
                     " invalid ones refused",
    "G8/unanswered": "a bad request (not framing corruption) is answered and never closes"
                     " its connection",
    # access.py: G13 (with auth on)
    "G13/unauthorized-accepted": "nothing a client's user may not do is accepted: stored,"
                                 " delivered, read or committed (it gets NotAuthorized)",
    "G13/wrongly-refused": "nothing a client's user may do is refused with NotAuthorized",
}


@dataclass(frozen=True, order=True)
class Violation:
    """One broken rule: the guarantee (G1-G7 or ``liveness``), a rule id and the evidence."""

    t: float
    guarantee: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.guarantee} {self.rule}] t={self.t:.6f}: {self.message}"


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # ``guarantee/rule`` -> how many facts (events, pages, messages) the rule judged
    examined: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, guarantee: str, rule: str, t: float, message: str) -> None:
        """Record that rule ``guarantee/rule`` (one of :data:`RULES`) was broken."""
        _known(guarantee, rule)
        self.violations.append(Violation(t, guarantee, rule, message))

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def examine(self, guarantee: str, rule: str, n: int = 1) -> None:
        """Rule ``guarantee/rule`` judged ``n`` more facts (whether or not they broke it),
        so a rule that never fires in a scenario set shows up (``flux sim --rule-stats``)."""
        key = _known(guarantee, rule)
        self.examined[key] = self.examined.get(key, 0) + n

    def rules(self) -> list[str]:
        """Distinct ``guarantee/rule`` ids broken, in order of first occurrence."""
        seen: dict[str, None] = {}
        for v in sorted(self.violations):
            seen.setdefault(f"{v.guarantee}/{v.rule}", None)
        return list(seen)

    def summary(self, limit: int = 20) -> str:
        lines = [", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))]
        ordered = sorted(self.violations)
        lines += [str(v) for v in ordered[:limit]]
        if len(ordered) > limit:
            lines.append(f"... and {len(ordered) - limit} more violations")
        return "\n".join(lines)


def _known(guarantee: str, rule: str) -> str:
    key = f"{guarantee}/{rule}"
    if key not in RULES:
        raise ValueError(f"checker rule {key!r} is not in flux.sim.checker.RULES")
    return key


def check(history: History) -> Report:
    """Check ``history`` against G1-G7 and liveness; the report lists every violation."""
    from flux.sim.checker import (
        access,
        bad_input,
        calls,
        dead_letters,
        delayed,
        delivery,
        durable,
        liveness,
        publish,
        pull,
        retention,
        shared,
        starts,
    )

    report = Report()
    index = Index(history)
    publish.check(index, report)
    calls.check(index, report)
    delivery.check(index, report)
    retention.check(index, report)
    starts.check(index, report)
    liveness.check(index, report)
    pull.check(index, report)
    bad_input.check(index, report)
    durable.check(index, report)
    access.check(index, report)
    delayed.check(index, report)
    shared.check(index, report)
    dead_letters.check(index, report)
    # the same fact can break a rule more than once (e.g. one message, many sessions)
    report.violations = sorted(set(report.violations))
    return report
