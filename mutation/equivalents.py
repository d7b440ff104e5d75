"""Surviving mutants judged equivalent: no test can tell them from the original.

Keyed by mutmut's mutant name (module, function, number), each with the reason
in one line. A name goes stale when its function changes; the report then lists
the mutant with the other survivors until it is judged again.
"""

from __future__ import annotations

_C = "flux.client."
_S = "flux.shard."

EQUIVALENT: dict[str, str] = {
    _C + "dispatch.xǁDispatchǁ_on_published__mutmut_2":
        "`results` is read only when there is no error, after it was assigned from the frame.",
    _C + "dispatch.xǁDispatchǁ_publish_frames__mutmut_53":
        "the queue is in deadline order (retries go back to the front and are older), so an"
        " expired part is only met with the frame still empty, and the outer loop then builds"
        " the same frame.",
    _C + "requests.xǁCallǁparse__mutmut_41":
        "`check_fetched` has already checked that ids, payloads and times have one length.",
    _C + "types.xǁPublishAcksǁ__iter____mutmut_23":
        "the core fills the columns of one batch together: they always have one length.",
    _C + "routing.xǁRoutingǁ__init____mutmut_38":
        "request ids need only be unique per connection; any first value does.",
    _C + "routing.xǁRoutingǁ__init____mutmut_50":
        "`_refresh_again` is only tested for truth: None and False read alike.",
    _C + "routing.xǁRoutingǁ_dirty__mutmut_10":
        "`_writable` is a dict used as an ordered set: its values are never read.",
    _C + "types.xǁSubscribeInfoǁfrom_reply__mutmut_41":
        "`body.get(\"reset\")` is None when absent, and bool(None) is False like the default.",
    _C + "core.xǁClientCoreǁpublish_many__mutmut_49":
        "`ids` was checked to have one id per payload just before: strict or not, zip pairs"
        " them alike.",
    _C + "core.xǁClientCoreǁunsubscribe__mutmut_4":
        "connections are keyed by their int ids: `conns.get(None)` is None like the default.",
    _C + "dispatch.xǁDispatchǁ_on_hello__mutmut_45":
        "`Conn.generation` is recorded but never read: every reply carries its own generation.",
    _C + "dispatch.xǁDispatchǁ_publish_frames__mutmut_142":
        "the group's arrays are copied again on every merge: only the speed differs, the"
        " arrays extended are still the frame's own.",
    _C + "subscription.xǁSubStateǁdeliver__mutmut_76":
        "the set of buffered offsets is read only for a re-push (attempt > 1): making it for"
        " a first delivery too changes nothing.",
    _S + "cleanup.xǁCleanupǁ_cleanup_messages__mutmut_71":
        "a slice stops before a topic it has no room for, so the budget is above 0 after"
        " every finished visit: this check is never true, with <= or with <.",
    _S + "delivery.xǁDeliveryǁ_deliver__mutmut_9":
        "summing the lengths of a PackedPayloads gives its `size`: only the speed differs.",
    _S + "publishing.xǁPublishingǁ_publish_fast__mutmut_30":
        "ids of exactly _SHORT_ID bytes take the per-item path; both paths give the same"
        " results (test_fast_and_per_item_publish_paths_give_the_same_results).",
    _S + "pull.xǁPullǁ_fetch__mutmut_57":
        "the byte budget is only compared with byte counts: a float half compares the same.",
    _S + "subscription.xǁSubscriptionǁ_reset_push_state__mutmut_1":
        "deadlines and re-pushes are cleared in the same step, so no timer entry of an earlier"
        " epoch is left for the epoch to tell apart.",
    _S + "delivery.xǁDeliveryǁ_deliver__mutmut_19":
        "where 40 bytes an item fit the budget and 41 do not, the split path counts 40 an item"
        " too and sends the same one frame.",
    _S + "inflight.xǁInFlightǁ__delitem____mutmut_9":
        "deleting the top of the run then goes through the dict form, which holds the same"
        " offsets and pushes.",
    _S + "subscription.xǁSubscriptionǁ_reset_push_state__mutmut_5":
        "a detached subscription pushes nothing, and `attach` sets the credit before any push.",
    _S + "topic.xǁTopicLogǁtrim__mutmut_64":
        "changes when the trimmed prefix of the columns is compacted, not what is held.",
    _C + "connection.xǁConnǁ__init____mutmut_13":
        "`heartbeat` is read only for a ready connection, and HELLO_OK sets it as it makes the"
        " connection ready; \"\" is falsy like None anyway.",
    _C + "core.xǁClientCoreǁacker__mutmut_9":
        "without the inlined path the ack goes through `ClientCore.ack`, whose first branch is"
        " the same steps: only the speed differs.",
    _C + "dispatch.xǁDispatchǁ_on_hello__mutmut_44":
        "`Conn.generation` is recorded but never read: every reply carries its own generation"
        " (as _on_hello__mutmut_45).",
    _C + "dispatch.xǁDispatchǁ_publish_frames__mutmut_33":
        "`owned` is read only when merging into the frame's last group, and the group before"
        " it was made by the branch that sets `owned`: its first value is never read.",
    _C + "dispatch.xǁDispatchǁ_publish_frames__mutmut_119":
        "`PublishPart.in_flight` is written but never read.",
    _C + "subscription.xǁAckSessionǁconfirm__mutmut_8":
        "with `sent_top` and every queued ack below the cursor, every ack is in old..cursor-1,"
        " so cursor - old >= len(acked) already holds: the weaker test clears the same acks.",
    _C + "subscription.xǁAckSessionǁdeliver_first__mutmut_16":
        "a list then takes the per-offset path, which appends the same offsets (none at or"
        " above next_offset was delivered or acked) and moves next_offset alike.",
    _S + "cleanup.xǁCleanupǁ_cleanup_messages__mutmut_34":
        "on a tie `below` is set to the value it already has.",
    _S + "delivery.xǁDeliveryǁ_deliver__mutmut_2":
        "the budget is only compared with integer sizes, and n <= x / 2 iff n <= x // 2 (and"
        " n > likewise) for an integer n.",
    _S + "publishing.xǁPublishingǁ_publish_fast__mutmut_80":
        "without `size` remember_all computes len(\"\".join(ids)), which is `id_bytes`.",
    _S + "state.xǁShardStateǁ_next_offset__mutmut_3":
        "its one caller (`Pull._fetch`) overwrites both offsets from the log when the topic"
        " is held, and the topic is then not in `retired`.",
    _S + "subscription.xǁSubscriptionǁcommit__mutmut_4":
        "commit is only called on pull subscriptions, which are never attached and so never"
        " hold individually acked offsets: `acked` is empty.",
    _S + "topic.xǁTopicLogǁ_chunk__mutmut_7":
        "every caller asks for a held offset (>= oldest >= the head chunk's first) and the"
        " chunks before the head start lower: bisecting from 0 finds the same chunk.",
    # seed 23
    _C + "connection.xǁConnǁ__init____mutmut_14":
        "`max_frame_bytes` is read only when building PUBLISH frames on a ready connection,"
        " and HELLO_OK sets it as it makes the connection ready.",
    _C + "core.xǁClientCoreǁpublish_many__mutmut_42":
        "the sum is only a cheap gate for the exact per-message check; an id is at most"
        " MAX_ID_BYTES, so with 5 as with 4 every message too large passes the gate.",
    _C + "core.xǁClientCoreǁpublish_many__mutmut_46":
        "`ids` was checked above to have one id per payload: `strict` never fires.",
    _C + "dispatch.xǁDispatchǁ_call_failed__mutmut_1":
        "a call's `in_flight` is written but never read.",
    _C + "dispatch.xǁDispatchǁ_on_hello__mutmut_47":
        "a connection's `generation` is written but never read (acks carry the generation"
        " of their subscription's session).",
    _C + "dispatch.xǁDispatchǁ_on_hello__mutmut_53":
        "dead branch: a live shard connection is always its slot's conn (a slot's conn is set"
        " only when it is opened and cleared only by `_close`, which forgets the connection,"
        " and a shrinking map closes the connections of the slots it drops).",
    _C + "dispatch.xǁDispatchǁ_on_published__mutmut_4":
        "`generation` is read only when there is no error, after it was assigned from the frame.",
    _C + "dispatch.xǁDispatchǁ_on_published__mutmut_54":
        "base + n never exceeds len(offsets), so the fast path is just never taken; the general"
        " path with base 0 gives the same offsets, duplicates and refused items (indexes"
        " checked in range by `_check_published`).",
    _C + "routing.xǁRoutingǁ_route__mutmut_35":
        "`_writable` is a dict used as an ordered set: its values are never read.",
    _C + "types.xǁPublishAcksǁ__iter____mutmut_11":
        "`map` stops with its shortest iterable, the zip of n columns: an unbounded repeat"
        " gives the same n acks.",
    _S + "inflight.xǁInFlightǁdrop_through__mutmut_12":
        "the deque only drives the pops; without maxlen 0 it keeps the popped Nones until it is"
        " dropped at once, and nothing reads it.",
    _S + "publishing.xǁPublishingǁ_publish__mutmut_49":
        "`touched` only caches `_topic(name)`, which returns the same registered topic within a"
        " frame (topics are retired only by the cleanup passes).",
    _S + "topic.xǁTopicLogǁtrim__mutmut_26":
        "with b == a nothing is dropped, the budget stays positive so b < len(chunk), and the"
        " loop breaks with `skip` unchanged, as the original does.",
    _S + "topic.xǁTopicLogǁtrim__mutmut_59":
        "changes when the trimmed prefix of the columns is compacted (more often), not what is"
        " held.",
    _S + "topic.xǁTopicLogǁtrim__mutmut_63":
        "changes when the trimmed prefix of the columns is compacted (a third instead of a half),"
        " not what is held.",
}
