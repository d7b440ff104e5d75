"""A fixed set of seeds over every scenario, plus every seed that once found a bug.

Select with ``pytest -m sim``. Each failure prints the command that replays it.
"""

from __future__ import annotations

import pytest

from flux.sim.faults import decode_plan
from flux.sim.runner import describe, run
from flux.sim.scenarios import SCENARIOS

SEEDS_PER_SCENARIO = 16

# Seeds that found real bugs: (scenario, seed, plan or None for the seed's own).
FOUND = [
    # a router's ADOPT whose connection a restart reset crashed the shard: an error
    # grouped by move_on_at's nursery escaped ShardServer._serve_control
    ("strict", 18, "router:router@17.049+1.216,pause:shard-0@17.942+0.883"),
    # a reset of the shard's control link crashed the shard (an ExceptionGroup escaped
    # ShardServer._control_session); both fail with that bug put back
    ("default", 3, "reset:router<->shard-1@17.324"),
    ("default", 7, None),
    # a router fault due at the very moment of the heal started after it, so nothing
    # restarted the router and the liveness canary was never acked (a simulator bug)
    ("crashes", 90, None),
    # a reader with from_offset=3 after two shard restarts left its topic with fewer
    # messages: OffsetOutOfRange every time, rightly, yet the liveness check wanted it
    # subscribed (a checker bug)
    ("cleanup", 137, "pause:shard-0@5.538+4.151,pause:shard-0@18.913+4.089"),
    # a SUBSCRIBED reply held up by a stall reported the cursor of when the shard
    # answered; acks confirmed meanwhile made the checker call it a cursor moving back
    # (a checker bug: it now compares with what was confirmed before the request)
    ("network", 525, "stall:shard-0->s5@1.602+0.796"),
    # the same for pushes: a DELIVER held up by a stall crossed an ack confirmed on
    # the session that took over, and the checker called it a redelivery of an acked
    # offset (now only acks confirmed before the session's SUBSCRIBE was sent count)
    ("network", 1392, "stall:s6<->shard-0@5.783+0.58"),
    # a shard deleted an ephemeral subscription whose session had ended on its side (an
    # UNSUBSCRIBE whose reply a partition held; two heartbeat periods of silence), then
    # trimmed what it had not acked, rightly; the checker held such messages until the
    # client saw its session end (a checker bug: the oracle now reports the deletion)
    ("network", 1180, "partition:shard-0->s2@3.137+5.596"),
    ("network", 1347, "partition:s1<->shard-2@4.936+7.685"),
    # a partition held a subscription's last push and its SubscriptionInactive until the
    # heal; the shard deleted it inactive_time after it went inactive, rightly, and the
    # checker took the held push's arrival for the time it was attached (a checker bug: a
    # push or reply counts only when its link was quiet, a confirmed ACK from its sending)
    ("network", 4269, "partition:s0<->shard-0@29.07+4.233"),
    # a slow link's backlog (latency x25) held a first push sent as the slow spell ended
    # until its re-push came; the checker took the link for quiet from the spell's end and
    # called the re-push early (a checker bug: a slow spell now disturbs its link for
    # factor x latency bound after it ends)
    ("network", 308, "slow:s1<->shard-0@2.301+4.043x25.3"),
    # disk topics (G9). A reply held for durability let a DELIVER made just after its
    # release wait for the next output pass (0.3 s late: early re-pushes by the client's
    # clock), and a takeover's SUB_ENDED overtook the SUBSCRIBED it followed
    ("disk", 87, None),
    ("disk", 13, None),
    # two pauses of one shard overlapped; the checker kept only the first (a checker bug)
    ("disk", 142, "reset:s0<->shard-0@17.205,crash:shard-0@17.684,pause:shard-1@23.36+5.083,"
                  "pause:shard-1@28.06+4.425"),
    # a flipped bit in the last record looked like a torn tail and was cut silently, losing
    # a confirmed ack in the same generation (now: same boot, so corruption)
    ("disk", 26, "router:router@17.124+3.148,flip:shard-0@27.751"),
    # a new generation drawn at recovery was not on disk until the topic's next record:
    # a second restart brought the old generation back with offsets from 0
    ("disk", 236, "flip:shard-0@5.906,flip:shard-0@9.004"),
    # old segments went before the snapshot that replaced them was synced (fsync never)
    ("disk", 14, None),
    # a crash in the middle of a recovery that had cut damage left a clean log of the
    # old generation: the next recovery kept it, and offsets acked in it came again
    ("storage-faults", 382, "flip:shard-0@12.879,crash:shard-0@13.161,flip:shard-0@24.713,"
                            "crash:shard-0@24.726"),
    # a crash between a publish's write and its fsync: recovery read the record back from
    # the page cache and counted it durable without an fsync; the retry was acked as its
    # duplicate, and a power loss then lost it: offset 24 used again (G1/offset-reused)
    ("storage-faults", 406, "power:shard-0@6.82,power:shard-0@9.037,power:shard-0@14.878,"
                            "crash:shard-0@17.585,flip:shard-0@17.954,flip:shard-0@25.456,"
                            "power:shard-0@26.672"),
    # an fsync that failed (EIO) in the middle of a recovery raised out of the shard: now
    # the shard exits unserved as after any log failure, and recovers again at the restart
    ("disk-errors", 172, "eio:shard-1@1.604,full:shard-1@4.597+2.169,eio:shard-0@18.078,"
                         "slowdisk:shard-1@19.633+2.104,slowdisk:shard-0@20.51+1.413,"
                         "slowdisk:shard-1@21.226+2.613,crash:shard-1@21.9,eio:shard-1@21.9"),
    # that shard's drain came while a connection's serving nursery was closing (its
    # writer had hit a broken stream): starting the close guard there raised
    ("disk-errors", 172, "eio:shard-1@1.604,full:shard-1@4.597+2.169,slowdisk:shard-1@7.2715+0.5,"
                         "power:shard-1@7.4765,eio:shard-0@18.078,slowdisk:shard-1@19.633+2.104,"
                         "slowdisk:shard-0@20.51+1.413,slowdisk:shard-1@21.226+2.613,"
                         "crash:shard-1@21.9,eio:shard-1@21.995"),
    # an ephemeral subscription made while a publish waited for its fsync was told a start
    # past it; a power loss lost that record, and its offset went to a later message, so
    # the start had skipped it (G6/start-past-new; disk-errors seed 172 found it first)
    ("disk-errors", 127, "slowdisk:shard-0@2.654+2.112,full:shard-0@8.324+3.881,"
                         "power:shard-0@11.8465"),
    # a cumulative ack crossed the push of a delayed message of a lower offset (G12:
    # pushed out of offset order), and the shard took it as acked though the client had
    # not seen it yet; now an ack_through never covers a delayed message
    ("delays", 92, None),
    # an ACK refused with StorageUnavailable (the shard's log had failed) was raised to
    # the user's loop by the client (a retryable refusal now is not: the session ends)
    # a crash right after a recovery made a new segment left it empty. Then: the next
    # recovery appended to it without a snapshot, so once the segment before it went, a
    # named subscription was lost at the restart after; and when that segment began a
    # new generation, the older generation's cursors and acks were taken for the new
    # one's (a message never delivered in it counted as acked). Both G5/deleted-unacked
    ("shared", 321, None),
    # a new round of a shared subscription on a topic with delayed messages: its first
    # picks came in due order, the lowest not first, and a message waiting as a hand-off
    # was pushed twice at once, as attempt 2 and attempt 1 (G4/early-redelivery)
    ("shared", 437, None),
    # a member's first pushes, consecutive but kept out of line below the oldest message
    # (delayed ones a trim passed, due now), were read as one in-line span of the log:
    # the shard crashed (a member's run is read as a span only from the oldest on)
    ("shared", 10, None),
    ("disk-errors", 0, "eio:shard-0@30.128"),
    # "fsyncgate": a failed fsync's pages read back from the page cache at the restart,
    # recovery's own fsync "succeeded" without writing them, and it counted them as
    # durable (a retry acked as their duplicate); a power loss then lost them, and found
    # a hole (fsync always: G9/generation-kept). Now the writer leaves a marker and
    # recovery cuts the log at the synced mark
    ("disk-errors", 67, "eio:shard-0@2.7,power:shard-0@6.02"),
    ("disk-errors", 1, None),
    # checker: a bit rotted in a disk topic's log, the shard read it back and recovered
    # the topic alone in a new generation; G12/cleanup-held-back still waited for the old
    # generation's acked messages to be deleted (its spans now end at the first rot)
    ("storage-faults", 122, "rot:shard-0@5.578"),
    # checker: a recovery that began a new generation (a flipped bit) carried a pull
    # subscription into it from the oldest message; no client resumed it there, so the
    # rule did not count it as a holder until the shard deleted it
    ("storage-faults", 151, "flip:shard-2@1.771,crash:shard-2@4.836"),
    ("storage-faults", 197, None),
    # pushes queued behind a reply held for durability (a full disk, then a slow fsync)
    # started their ack timeout when made: the client got the re-push with the first
    ("disk-errors", 20, "full:shard-1@21.772+2.569"),
    ("disk-errors", 52, "slowdisk:shard-0@1.985+1.182,slowdisk:shard-0@9.386+0.567,"
                        "full:shard-0@9.848+1.146,eio:shard-0@12.328"),
    # cleanup trimmed messages whose records a full disk kept from being durable: a FETCH
    # saw a head past the end it may read
    ("disk-errors", 90, "full:shard-1@8.451+3.335"),
    # G11. A nak on a message's last push ended the attachment before the frame's acks
    # were applied: an ack the ACKED confirmed was dropped, and the message came again
    ("deadletters", 50, None),
    ("deadletters", 104, None),
    # first pushes that carried push counts went out in offset order, not due order
    ("deadletters", 23, None),
    # the checker took a refused in_progress (a nak'd message waiting for its re-push)
    # for a refused ack; and a dead-letter topic's page for a second copy of a call's
    # message (a checker bug each)
    ("deadletters", 7, "power:shard-0@2.166"),
    ("deadletters", 115, None),
    # a trim at the very instant a dead letter was written: its flux-time (microseconds,
    # read back near 1.7e9) came back a float error later, and G5 called the message
    # unacked (a checker bug)
    ("deadletters", 309, None),
    ("deadletters", 395, None),
    # a memory topic's dead letter written after the last read of its dead-letter topic
    # went with its shard: G5 wanted it seen before it let the message's trim pass
    ("deadletters", 339, None),
    ("deadletters", 361, None),
    # messages pushed only to a session a partition cut off ran out of pushes when it was
    # taken over and went to the dead-letter topic, rightly; G2 wanted the subscriber to
    # have got them (a checker bug: a dead letter settles them, G11)
    ("deadletters", 249, None),
    # G12 on disk topics: a kept delayed message recovered from its KEEP record, when no
    # message in line had a key or headers, was delivered without its own (G2/meta-changed)
    ("delays-disk", 123, None),
    # the shard's READY (its recovery over) and a heartbeat PING went out on the router
    # link at once: trio refused the second send and the shard crashed
    ("delays-disk", 127, None),
    # a FETCH below a kept delayed message of a disk topic read the messages after it up
    # to the log's end, past the durable end it may read (G1/fetch-range)
    ("disk-errors", 91, None),
    # a shard orphaned by a long router outage drained: it cut its sessions at once and
    # stopped 0.9 s later, once its connections closed; G6 took the cut for one without
    # cause (it allowed a stop one latency bound after, not a drain's grace; a checker bug)
    ("delays-disk", 469, None),
    # a recovery that started a disk topic's new generation (a power loss, fsync never)
    # started its subscriptions over at the oldest message in line, past a kept delayed
    # message below it, never delivered there (G7/reset-start); and, once fixed, the
    # start at that kept message above offsets cleaned up already made G5/fetch-skipped,
    # gone-unacked and deleted-unacked take it for a start at the oldest held in line
    ("delays-disk", 3, "power:shard-1@3.947"),
    ("delays-disk", 39, "power:shard-0@6.256"),
    ("delays-disk", 4, "power:shard-0@20.584"),
    # the same start made G2/lost want of a pull reader the offsets cleaned up between
    # that kept message and the oldest in line before its reset made it (a checker bug)
    ("kept-disk", 99, "power:shard-1@17.584"),
    # read_old and a from_offset started at the oldest message in line, past the kept
    # delayed messages below it (G6/start-above-held: all three); once they start at a
    # kept one, a cursor left in the hole above it (offsets gone before the subscription
    # was made) held back every trim once no delayed message was held (G12/cleanup-
    # held-back: all three), and G4/left-unacked, G5/deleted-unacked, gone-unacked,
    # fetch-skipped and G2/lost wanted the hole's offsets of it (checker bugs)
    ("delays", 27, None),
    ("delays", 11, None),
    ("delays", 52, None),
]

CASES = [(scenario, seed, None) for scenario in SCENARIOS
         for seed in range(SEEDS_PER_SCENARIO)] + FOUND


@pytest.mark.sim
@pytest.mark.parametrize(("scenario", "seed", "plan"), CASES,
                         ids=[f"{sc}-{seed}{'-plan' if plan else ''}" for sc, seed, plan in CASES])
def test_seed_passes_every_check(scenario: str, seed: int, plan: str | None) -> None:
    result = run(seed, scenario, decode_plan(plan) if plan is not None else None)
    assert result.ok, "\n".join(describe(result, limit=30)) + (
        f"\nreplay: flux sim --seed {seed} --scenario {scenario} --plan '{result.plan}'")
