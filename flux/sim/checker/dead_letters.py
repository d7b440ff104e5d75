"""G11 checks: naks, terms and dead letters.

Dead letters are known from what a reader FETCHed of dead-letter topics (their
reserved ``flux-`` headers name the source message); terms and naks from the
ACK frames that carried them and the ACKED replies that confirmed them.
"""

from __future__ import annotations

from flux.hashing import dead_letter_topic
from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import DeadLetter, Incarnation, Index

EPSILON = 1e-6
# faults after which a dead-letter topic may lose what it held: a memory topic's shard
# stopping, a disk topic's machine losing power or its log's bits (G9)
STORAGE_FAULTS = ("power", "flip", "eio", "full")


def check(index: Index, report: Report) -> None:
    published = _published(index)
    for letters in index.dead_letters.values():
        for letter in letters.values():
            _check_record(letter, published, 1 + index.params_for(letter.topic).retry_count,
                          report)
    for inc in index.incarnations:
        if inc.name is None:
            continue
        p = index.params_for(inc.topic)
        letters = index.dead_letters.get((inc.topic, inc.generation, inc.name), {})
        _check_pushed_after(index, inc, letters, report)
        _check_terms(index, inc, p.dead_letter, letters, report)
    for inc in index.incarnations:
        _check_naks(index, inc, report)
        if not index.params_for(inc.topic).dead_letter:
            continue
        for session in inc.sessions:
            report.examine("G11", "exhausted-not-dead-lettered")
            end = session.end
            if end is not None and end.reason == "inactive":
                report.add("G11", "exhausted-not-dead-lettered", end.t,
                           f"{session.sub.subscriber} session {session.sub.session} was made"
                           f" inactive (SubscriptionInactive) on {inc.topic}, whose policy"
                           " sends exhausted messages to a dead-letter topic instead")


def _published(index: Index) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """(topic, id) -> (payload key, meta key) of what was first published."""
    out: dict[tuple[str, str], tuple[str | None, str | None]] = {}
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            out.setdefault((e.topic, e.id), (e.payload, e.meta))
    return out


def _check_record(letter: DeadLetter, published: dict[tuple[str, str], tuple[str | None,
                                                                             str | None]],
                  max_pushes: int, report: Report) -> None:
    """A dead letter carries the message as it was published: its id, payload, key and
    headers, in its subscription's dead-letter topic, with a reason of G11's; one out of
    pushes used all ``max_pushes`` (its pushes may all have been lost to faults, so G2
    does not ask that its subscriber got it: this is what keeps it honest)."""
    original = published.get((letter.topic, letter.id))
    report.examine("G11", "dead-letter-record")
    problems = []
    if letter.dead_letter_topic != dead_letter_topic(letter.topic, letter.subscription):
        problems.append(f"it is in {letter.dead_letter_topic!r}")
    if original is None:
        problems.append("no message of that id was published to its topic")
    else:
        payload, meta = original
        if payload is not None and letter.payload and letter.payload != payload:
            problems.append(f"payload {letter.payload!r}, published {payload!r}")
        if letter.meta != meta:
            problems.append(f"key and headers {letter.meta}, published {meta}")
    if not (letter.reason == "exhausted" or letter.reason.startswith("term")):
        problems.append(f"reason {letter.reason!r}")
    elif letter.reason == "exhausted" and letter.pushes < max_pushes:
        problems.append(f"out of pushes after {letter.pushes} of {max_pushes}")
    if problems:
        report.add("G11", "dead-letter-record", letter.seen,
                   f"dead letter of {letter.topic}@{letter.offset} id={letter.id!r}"
                   f" ({letter.subscription}): " + "; ".join(problems))


def _check_pushed_after(index: Index, inc: Incarnation, letters: dict[int, DeadLetter],
                        report: Report) -> None:
    """A dead-lettered message is never pushed to its subscription afterwards. Sound
    under any delay and fault: a push of a session whose SUBSCRIBE was sent after the
    dead letter was written was made after it; so was one that arrived, over a link
    no fault touched, more than a latency bound after it."""
    lat = index.params.latency
    for session in inc.sessions:
        hosts = (session.sub.client, session.host)
        for e in session.events:
            if not isinstance(e, h.Delivered) or e.offset not in letters:
                continue
            letter = letters[e.offset]
            report.examine("G11", "dead-letter-pushed")
            after = session.sub.requested > letter.at + EPSILON or (
                e.t > letter.at + lat and index.quiet(hosts, letter.at, e.t))
            if after:
                report.add("G11", "dead-letter-pushed", e.t,
                           f"{e.subscriber} session {e.session} got {e.topic}@{e.offset}"
                           f" (attempt {e.attempt}) at {e.t:.3f}; it was dead-lettered"
                           f" ({letter.reason}) at {letter.at:.3f}")


def _check_terms(index: Index, inc: Incarnation, dead_letter: bool,
                 letters: dict[int, DeadLetter], report: Report) -> None:
    """A termed message is never pushed again to its subscription; with a dead-letter
    policy, it is in the dead-letter topic. Sound under any delay and fault: the
    shard settles a term before it answers, a connection keeps the order of what the
    shard sent (a push arriving after the ACKED was sent after the term), a later
    session's SUBSCRIBE reached the shard after it, and a confirmed term is durable
    on a disk topic (G9). A dead letter is looked for only in a read of its whole
    dead-letter topic sent after the confirmation, and not when a fault may have
    taken the dead-letter topic away since (its shard stopping, for a memory topic;
    its machine's storage faults, for a disk topic)."""
    confirmed: dict[int, tuple[float, int]] = {}   # offset -> (when, session)
    for e in inc.events:
        if isinstance(e, h.AckConfirmed):
            for o in e.terms:
                if o not in confirmed:
                    report.examine("G11", "termed-pushed")
                    confirmed[o] = (e.t, e.session)
        elif isinstance(e, h.Delivered) and e.offset in confirmed:
            at, where = confirmed[e.offset]
            session = index.sessions[e.session]
            if (e.session == where and e.t > at) or session.sub.requested > at:
                report.add("G11", "termed-pushed", e.t,
                           f"{e.subscriber} session {e.session} got {e.topic}@{e.offset}"
                           f" (attempt {e.attempt}) after its term was confirmed at {at:.3f}")
    if not dead_letter or not confirmed:
        return
    name = dead_letter_topic(inc.topic, inc.name or "")
    reads = [e for e in index.history if isinstance(e, h.Fetched) and e.topic == name
             and e.offset <= e.oldest and not e.holes and e.first + len(e.ids) >= e.next]
    memory = inc.generation in index.shard_generations
    shard = inc.sessions[0].sub.shard if inc.sessions else -1
    for o, (at, _) in confirmed.items():
        # a memory topic's dead letters live in its shard incarnation: a read of another
        # generation (the shard restarted, which a run without the oracle may not record)
        # says nothing of them
        read = next((e for e in reads if e.requested > at
                     and (not memory or e.generation == inc.generation)), None)
        if read is None or _may_be_lost(index, memory, inc.generation, shard, at, read.t):
            continue
        report.examine("G11", "dead-letter-missing")
        letter = letters.get(o)
        if letter is None or letter.seen > read.t:
            report.add("G11", "dead-letter-missing", read.t,
                       f"{inc.topic}@{o} of {inc.name} was termed (confirmed at {at:.3f})"
                       f" with a dead-letter policy, but a whole read of {name} sent after"
                       " that does not hold it")


def _may_be_lost(index: Index, memory: bool, generation: int, shard: int, t1: float,
                 t2: float) -> bool:
    if memory:
        return index.stopped.get(generation, float("inf")) <= t2
    host = f"shard-{shard}"
    return any(d.fault in STORAGE_FAULTS and host in d.hosts and d.end >= t1 and d.begin <= t2
               for d in index.disturbances)


def _check_naks(index: Index, inc: Incarnation, report: Report) -> None:
    """A nak'd message is not pushed again before the nak's delay has passed from when
    the nak was sent. Sound under any delay and fault: the shard handles the nak after
    it was sent and pushes the message no earlier than its delay after that; only
    confirmed naks count (a refused one changed nothing). A nak may race with a
    timeout's re-push (the nak then applies to that push), so the next push is judged
    only when its link was quiet and that re-push could not have been sent before the
    nak arrived; every later push always."""
    p = index.params_for(inc.topic)
    lat = p.latency
    for session in inc.sessions:
        hosts = (session.sub.client, session.host)
        pushes: dict[int, list[tuple[float, int]]] = {}
        # offset -> (sent, delay, the last push it had seen then: (arrival, attempt))
        sent: dict[int, tuple[float, float, tuple[float, int]]] = {}
        naks: list[tuple[float, int, float, int, float]] = []  # (sent, offset, delay, k, t_k)
        for e in session.events:
            if isinstance(e, h.Delivered):
                pushes.setdefault(e.offset, []).append((e.t, e.attempt))
            elif isinstance(e, h.AckSent):
                for o, delay in e.naks:
                    if o in pushes:
                        sent[o] = (e.t, delay, pushes[o][-1])
            elif isinstance(e, h.AckConfirmed):
                for o, _ in e.naks:
                    if o in sent:
                        t_s, delay, (t_k, k) = sent.pop(o)
                        naks.append((t_s, o, delay, k, t_k))
        for t_s, o, delay, k, t_k in naks:
            due = t_s + delay
            for t, attempt in pushes.get(o, ()):
                if attempt <= k or t >= due - EPSILON:
                    continue
                if attempt == k + 1 and not (
                        t_s + 2 * lat < t_k + p.period - lat
                        and index.quiet(hosts, t_k - lat, t)):
                    continue  # perhaps a timeout's re-push sent before the nak arrived
                report.examine("G11", "nak-early")
                report.add("G11", "nak-early", t,
                           f"{session.sub.subscriber} session {session.sub.session}:"
                           f" {inc.topic}@{o} attempt {attempt} at {t:.3f}; it was nak'd"
                           f" with delay {delay:g} at {t_s:.3f} (not due before {due:.3f})")
            report.examine("G11", "nak-early")
