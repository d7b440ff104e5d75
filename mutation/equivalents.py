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
    _S + "dedup.xǁDedupWindowǁ_drop_blocks__mutmut_10":
        "a block is dropped one forgetting later: membership is the set of known ids and a"
        " re-accepted id is found in a newer block first, so only memory is held longer.",
    _S + "dedup.xǁDedupWindowǁexpire__mutmut_61":
        "changes when the forgotten prefix of the marks is compacted, not what is remembered.",
    _S + "dedup.xǁDedupWindowǁremember_all__mutmut_21":
        "changes how large an index block grows, not which ids are known or their offsets.",
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
    _S + "dedup.xǁDedupWindowǁ__init____mutmut_6":
        "the first remember finds no block, starts one and sets `_filled` to 0 before any read.",
    _S + "dedup.xǁDedupWindowǁremember_all__mutmut_20":
        "each call then starts its own index block: it changes how large a block grows, not"
        " which ids are known or their offsets (as remember_all__mutmut_21).",
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
}
