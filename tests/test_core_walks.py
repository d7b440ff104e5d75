"""Seeded random walks through the rules of test_core_stateful's model of ShardCore.

Hypothesis favours short, simple runs; these long walks through the same model reach
states it rarely builds (e.g. a reattach whose window is smaller than an acked gap, a
message out of pushes met again on reattaching). A failure names its seed; replay it
with ``_walk``.
"""

from __future__ import annotations

import random

import pytest
from test_core_model import PRESETS
from test_core_stateful import DELAYS, ShardModel

_WALK_RULES = ["connect", "publish", "subscribe", "resubscribe", "ack", "ack_newest", "settle",
               "ack_detached_sid", "credit", "unsubscribe", "disconnect", "ping",
               "advance_to_next_deadline", "advance", "pull_subscribe", "fetch", "commit"]


def _walk(seed: int, steps: int) -> None:
    r = random.Random(seed)
    m = ShardModel()
    m.setup(preset=seed % len(PRESETS), dead_letter=seed % 2 == 1)
    for _ in range(steps):
        rule_name = r.choice(_WALK_RULES)
        i = r.randrange(10)
        if rule_name == "connect":
            m.connect()
        elif rule_name == "publish":
            m.publish(i, [(r.random() < 0.5, r.randrange(50), r.randrange(4))
                          for _ in range(r.randint(1, 4))], {r.randint(1, 3), r.randint(1, 6)},
                      [r.choice(DELAYS) for _ in range(4)])
        elif rule_name == "subscribe":
            m.subscribe(i, r.randint(1, 3), r.choice(["s1", "s2", None]), r.random() < 0.5,
                        r.choice([1, 2, 5]), r.choice([None, 0, 1, 3, 100]))
        elif rule_name == "resubscribe":
            m.resubscribe(i, r.randrange(10), r.randint(1, 3), r.choice([1, 2, 5]),
                          r.choice([None, 1, 100]))
        elif rule_name == "ack":
            m.ack(i, [r.randrange(20) for _ in range(r.randint(1, 4))],
                  r.choice([None, None, None, -1, 0, 2, 40]), r.random() < 0.25, r.randrange(10))
        elif rule_name == "ack_newest":
            m.ack_newest(i)
        elif rule_name == "settle":
            m.settle(i, [(r.choice(["nak", "term", "progress"]), r.randrange(21))
                         for _ in range(r.randint(1, 4))], r.choice([0.0, 0.5, 2.0, 5.0]))
        elif rule_name == "ack_detached_sid":
            m.ack_detached_sid(i, r.randint(1, 3))
        elif rule_name == "credit":
            m.credit(i, r.randrange(4))
        elif rule_name == "unsubscribe":
            m.unsubscribe(i, r.randint(1, 3))
        elif rule_name == "disconnect":
            m.disconnect(i)
        elif rule_name == "ping":
            m.ping(i)
        elif rule_name == "advance_to_next_deadline":
            m.advance_to_next_deadline(r.random() < 0.5)
        elif rule_name == "pull_subscribe":
            m.pull_subscribe(i, r.choice(["p1", "p2"]), r.random() < 0.5)
        elif rule_name == "fetch":
            m.fetch(i, r.choice(["p1", "p2", None]), r.randrange(40), r.randint(1, 5))
        elif rule_name == "commit":
            m.commit(i, r.choice(["p1", "p2"]), r.randint(-2, 4))
        else:
            m.advance(r.choice([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.5, 10.0, 17.0, 25.0]),
                      r.random() < 0.5)
        m.subscriptions_match_the_model()
        m.every_deliverable_message_is_pushed()
        m.core_sessions_match()
        m.dead_letters_match()


@pytest.mark.parametrize("seed", range(64))
def test_random_walk_agrees_with_the_model(seed: int) -> None:
    """G1-G6, G11, G12 along a long seeded walk (a failure names its seed; replay it with _walk)."""
    _walk(seed, 500)

