"""Push subscriptions: SUBSCRIBE, UNSUBSCRIBE, CREDIT and ACK (G1, G4, G6).

Creating, attaching, taking over and detaching subscriptions, and applying
acks to their cursors; pushing itself lives in ``flux.shard.delivery``.
"""

from __future__ import annotations

from typing import Any

from flux import errors
from flux.shard.journal import SUBSCRIPTION, TopicJournal, journal_mode
from flux.shard.sharing import Group, Sharing
from flux.shard.state import (
    MAX_CREDIT,
    P,
    Session,
    _bool,
    _map,
    _opt_int,
)
from flux.shard.subscription import Subscription


class Subscribing(Sharing):
    """The push-subscription and ack handlers."""

    def _subscribe(self, session: Session, frame: list[Any], now: float) -> None:
        rid, sid, opts = frame[1], frame[2], _map(frame, 3)
        if type(sid) is not int:
            raise errors.InvalidRequest("SUBSCRIBE sid must be an integer")
        name = self._authorize(session, "subscribe", self._check_owned(opts.get("topic"), True))
        sub_name = opts.get("name")
        mode = opts.get("mode", "push")
        if mode not in ("push", "pull"):
            raise errors.InvalidRequest(f"mode must be 'push' or 'pull', not {mode!r}")
        if sub_name is not None and (not isinstance(sub_name, str) or not sub_name
                                     or len(sub_name.encode()) > 255 or sub_name[0] == "~"):
            raise errors.InvalidRequest(
                "subscription name must be 1-255 bytes and not start with '~'")
        if sub_name is None and mode == "pull":
            raise errors.InvalidRequest("a pull subscription needs a name")
        shared = _bool(opts, "shared", False)
        key_ordered = _bool(opts, "key_ordered", False)
        if key_ordered and not shared:
            raise errors.InvalidRequest("key_ordered applies to a shared subscription only")
        if shared and sub_name is None:
            raise errors.InvalidRequest("a shared subscription needs a name")
        if shared and mode == "pull":
            raise errors.SubscriptionKindMismatch(
                "a shared subscription is a push subscription; pull readers share a"
                " subscription by FETCH and COMMIT already")
        read_old = _bool(opts, "read_old", False)
        from_offset = _opt_int(opts, "from_offset")
        known_generation = _opt_int(opts, "generation")
        on_reset = opts.get("on_reset", "earliest")
        if on_reset not in ("earliest", "raise"):
            raise errors.InvalidRequest(f"on_reset must be 'earliest' or 'raise', not {on_reset!r}")
        cap = self.config.subscriber.max_in_flight
        max_in_flight = _opt_int(opts, "max_in_flight")
        if max_in_flight is None:
            max_in_flight = cap
        if max_in_flight < 1:
            raise errors.InvalidRequest("max_in_flight must be at least 1")
        max_in_flight = min(max_in_flight, cap)
        credit = _opt_int(opts, "credit")
        if credit is not None and credit < 0:
            raise errors.InvalidRequest("credit must be >= 0")
        credit = max_in_flight if credit is None else min(credit, MAX_CREDIT)
        if mode == "push" and sid in session.subs and not session.subs[sid].deleted \
                and session.subs[sid].attached_as(session.conn, sid):
            raise errors.InvalidRequest(f"sid {sid} is already in use on this connection")
        if mode == "push" and sid not in session.subs:
            self._check_subscription_room(session)

        # a refused SUBSCRIBE must not leave a new, empty topic behind (G8): register the
        # topic only once the subscription is made
        topic = self.topics.get(name) or self._new_topic(name)
        generation = topic.generation
        reset = known_generation is not None and known_generation != generation
        if reset and on_reset == "raise":
            raise errors.TopicReset(
                f"topic {name!r} was reset: generation {known_generation} -> {generation}",
                old=known_generation, new=generation)
        log = topic.log
        # the next offset a client may hear of: a disk topic's offsets whose records are
        # not durable yet are not told (G9): a crash may lose them, and they are used again
        end = topic.exposed
        key = sub_name if sub_name is not None else f"~{session.conn}.{sid}"
        sub = topic.subs.get(key)
        created = sub is None
        clamped = False
        if sub is None:
            if reset:
                start = 0
            elif from_offset is not None:
                if from_offset < 0:
                    raise errors.InvalidRequest("from_offset must be >= 0")
                if from_offset > end:
                    raise errors.OffsetOutOfRange(
                        f"from_offset {from_offset} is past the next offset {end}")
                start = from_offset
            elif read_old:
                start = log.lowest
            else:
                start = end
            # never below the oldest message held: a kept delayed message below the
            # oldest in line counts (G12: a trim passed it while it was pending; it is
            # held, and delivered when due), the offsets gone around it are holes
            if start < log.lowest:
                start, clamped = log.lowest, True
            sub = Subscription(topic=name, name=key, ephemeral=sub_name is None, mode=mode,
                               cursor=start, start_offset=start, created_at=now,
                               group=Group(key_ordered) if shared else None)
            topic.subs[key] = sub
            self._subscribed[name] = topic
            if self.topics.setdefault(name, topic) is topic:
                self.retired.pop(name, None)
            self._emit("created", name, key, start)
            if topic.journal is not None and sub_name is not None:
                topic.journal.append(SUBSCRIPTION, [key, journal_mode(sub), start,
                                                    self.epoch + now])
        elif sub.mode != mode:
            raise errors.InvalidRequest(
                f"subscription {sub_name!r} is a {sub.mode} subscription, not {mode}")
        elif sub.shared != shared or (shared and sub.group.key_ordered != key_ordered):  # type: ignore[union-attr]
            raise errors.SubscriptionKindMismatch(
                f"subscription {sub_name!r} is {kind_of(sub)}, not {kind_of(None, shared, key_ordered)}:"
                " subscribe as it was made")

        if mode == "pull":
            sub.active = True
            sub.last_activity = now
        elif shared:
            self._join(sub, session, sid, credit, max_in_flight, now)
        else:
            old = sub.session
            if old is not None and old != (session.conn, sid):
                old_session = self.sessions.get(old[0])
                if old_session is not None:
                    old_session.out.append([P.SUB_ENDED, old[1], errors.SubscriptionTakenOver.code,
                                            f"subscription {key!r} was taken over by another"
                                            " session"])
                self._emit("taken_over", name, key, old)
            sub.attach((session.conn, sid), credit, max_in_flight, now)
            sub.carry_max = max(sub.push_counts, default=-1)  # counts kept (G11)
            self._attach_delays(topic, sub, now)
            session.subs[sid] = sub
            self._dirty[id(sub)] = sub
        reply = [P.SUBSCRIBED, rid, sid, {
            "created": created, "start_offset": sub.start_offset, "cursor": sub.cursor,
            "generation": generation, "clamped": clamped, "reset": reset,
            "next_offset": end,
            "max_in_flight": max_in_flight if shared else sub.max_in_flight,
        }]
        if shared:
            reply[3].update(shared=True, key_ordered=key_ordered,
                            members=len(sub.group.members))  # type: ignore[union-attr]
        if topic.journal is not None and not sub.ephemeral:
            self._journal_hold(session, reply, [topic.journal])  # its record first (G9)
        else:
            session.out.append(reply)

    def _check_subscription_room(self, session: Session) -> None:
        """Refuse a new push subscription past ``limits.max_subscriptions`` per session
        (sids whose subscription was taken over or deleted do not count)."""
        limit = self.config.limits.max_subscriptions
        if len(session.subs) < limit:
            return
        conn = session.conn
        live = sum(1 for sid, sub in session.subs.items()
                   if not sub.deleted and sub.attached_as(conn, sid))
        if live >= limit:
            raise errors.TooManySubscriptions(
                f"this connection holds {limit} push subscriptions (limits.max_subscriptions);"
                " unsubscribe one first, or subscribe on another connection")

    def _unsubscribe(self, session: Session, frame: list[Any], now: float) -> None:
        rid, sid = frame[1], frame[2]
        sub = session.subs.pop(sid, None) if type(sid) is int else None
        if sub is not None:
            self._detach_sid(sub, session.conn, sid, now)
        session.out.append([P.UNSUBSCRIBED, rid, sid])

    def _credit(self, session: Session, frame: list[Any], now: float) -> None:
        sid, n = frame[1], frame[2]
        if type(n) is not int or n < 0:
            raise errors.InvalidRequest("CREDIT n must be a non-negative integer")
        sub = session.subs.get(sid) if type(sid) is int else None
        if sub is None:
            return
        if sub.session == (session.conn, sid):
            sub.credit = min(sub.credit + n, MAX_CREDIT)
            self._dirty[id(sub)] = sub
        elif (member := self._member(sub, session.conn, sid)) is not None:
            member.credit = min(member.credit + n, MAX_CREDIT)
            self._dirty[id(sub)] = sub

    def _attached(self, session: Session, sid: Any) -> Subscription:
        sub = session.subs.get(sid) if type(sid) is int else None
        if sub is None or sub.deleted:
            raise errors.UnknownSubscription(f"no subscription with sid {sid} on this connection")
        if sub.group is not None:
            if (session.conn, sid) not in sub.group.members:
                raise errors.SubscriptionInactive(
                    f"this session is no longer a member of subscription {sub.name!r};"
                    " subscribe again to resume")
            return sub
        if sub.session != (session.conn, sid):
            if sub.session is None:
                raise errors.SubscriptionInactive(
                    f"subscription {sub.name!r} is inactive; subscribe again to resume")
            raise errors.SubscriptionTakenOver(
                f"subscription {sub.name!r} was taken over by another session")
        return sub

    def _ack(self, session: Session, frame: list[Any], now: float) -> None:
        rid, sid, generation, offsets, through = frame[1], frame[2], frame[3], frame[4], frame[5]
        settle = frame[6] if len(frame) > 6 else None  # nak, term, in_progress (G11)
        sub = self._attached(session, sid)
        topic = self.topics[sub.topic]
        if generation != topic.generation:
            raise errors.TopicReset(
                f"ack for generation {generation}, topic {sub.topic!r} is at {topic.generation}",
                old=generation if type(generation) is int else None, new=topic.generation)
        if not isinstance(offsets, list) or type(through) is not int:
            raise errors.InvalidRequest("ACK offsets must be an array and through an integer")
        refused: list[list[Any]] = []
        acked = 0
        journals: list[TopicJournal] = []
        settled = False  # terms counted as acks: the cursor record is due
        exhausted: list[tuple[int, int]] = []  # by a nak on its last push (no dead letters)
        member = self._member(sub, session.conn, sid)
        if settle is not None:  # before the acks: a through never covers a termed offset
            cursor, held = sub.cursor, len(sub.acked)
            if member is not None:
                journals = self._member_settle(sub, member, topic, settle, refused, now,
                                               exhausted)
            else:
                journals = self._settle(sub, topic, settle, refused, now, exhausted)
            settled = sub.cursor != cursor or len(sub.acked) != held
        if member is not None:
            acked = self._member_ack(sub, member, offsets, through, refused)
            offsets = []
            through = -1
        for offset in offsets:
            if type(offset) is not int:
                refused.append([offset, errors.InvalidRequest.code, "offset must be an integer"])
            elif sub.ack(offset) or (sub.nak_waiting and self._ack_waiting(sub, offset)):
                acked += 1
            elif not sub.was_delivered(offset):
                refused.append([offset, errors.NotDelivered.code,
                                f"offset {offset} was not delivered to this session"])
        if through >= 0:
            acked += sub.ack_through(through)
        if acked:
            self.counters["acked"] += acked
            self._dirty[id(sub)] = sub
            if member is None:
                sub.drop_acked_deadlines()
            if sub.push_counts:
                self._forget_counts(sub)
        reply = [P.ACKED, rid, sid, sub.cursor, refused]
        journal = self._journal_cursor(topic, sub) if acked or settled else topic.journal
        if journals or (journal is not None and not sub.ephemeral):
            # a confirmed ack is durable (G9), and so is a confirmed term's dead letter
            self._journal_hold(session, reply, [j for j in (journal, *journals) if j is not None])
        else:
            session.out.append(reply)
        if exhausted:  # the frame's acks are applied: now the attachment ends (G4)
            if member is not None:
                self._group_exhausted(sub, *exhausted[0], now)
            else:
                self._exhausted(sub, *exhausted[0], now)


def kind_of(sub: Subscription | None, shared: bool = False, key_ordered: bool = False) -> str:
    """A subscription's kind in words, for errors."""
    if sub is not None:
        shared, key_ordered = sub.shared, bool(sub.group and sub.group.key_ordered)
    if not shared:
        return "a plain subscription"
    return "a shared, key-ordered subscription" if key_ordered else "a shared subscription"
