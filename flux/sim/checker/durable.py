"""G9 checks: a disk topic keeps its generation across process crashes, and no message
is ever read back with a payload it was not published with.

A disk topic's generation is told from a shard incarnation's by the index (it is
none of the generations shards answered HELLO with). The other G9 promises need
no rules of their own: with the generation kept across restarts, the G1, G2, G3
and G6 rules per generation (offset-reused, fetch-next, lost, stored-twice,
cursor-moved-back, resume-below-commit, ...) already judge what a recovery gave
back against everything acked and confirmed before it.
"""

from __future__ import annotations

import math

from flux.hashing import shard_for
from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index

# faults after which a disk topic may rightly start a new generation (G9): damage
# found by recovery (a flipped bit in a synced block) and, with fsync interval or
# never, a power loss (the unsynced tail may be gone). With always, a power loss
# loses nothing acked or exposed: offsets continue
RESETTING = ("power", "flip")
RESETTING_ALWAYS = ("flip",)
# a bit flipped while the shard runs lies in wait: a read back or a later recovery
# finds it, so it may end any generation that began before it happened. So does an
# fsync error with fsync interval or never: it fails the next fsync, and recovery
# cuts the log at the last synced position, acked records past it included
LATENT = ("rot", "eio")
LATENT_ALWAYS = ("rot",)


# storage faults that may make a shard's log fail (it exits; the router restarts it):
# an fsync error, a data directory that takes no new file (a new segment cannot be
# made) and a power loss (which, like a crash, ends every open file). Not a
# full disk: that refuses publishes and makes writes wait; nor damage (flip, rot): a
# damaged record read back is its topic's alone, recovered while the others serve (G9).
FAILING = ("eio", "power", "nofiles")


# seconds within which a record appended by a shard is durable in every fsync mode with
# no fault on its machine (written at once; fsynced within a slow simulated fsync)
DURABLE_WITHIN = 2.5


def check(index: Index, report: Report) -> None:
    _check_generation_kept(index, report)
    _check_payloads(index, report)
    _check_storage_failures(index, report)
    _check_trims_kept(index, report)


def _check_trims_kept(index: Index, report: Report) -> None:
    """A disk topic's message cleanup deleted (the oracle's word: a trim, or a kept
    delayed message released, G12) stays deleted across restarts: it is not deleted
    again by a later incarnation of its shard in the same generation. Judged when the
    shard stopped ``DURABLE_WITHIN`` or more after the deletion and no fault touched its
    machine from as long before it to as long after it, so its TRIM or RELEASE record
    was durable (a power loss with fsync interval or never starts a new generation)."""
    first: dict[tuple[str, int, int], tuple[float, int]] = {}  # -> (when, shard)
    judged: dict[tuple[float, int], bool] = {}  # (when, shard) of a first deletion -> judged?

    def judge(t: float, shard: int) -> bool:
        verdict = judged.get((t, shard))
        if verdict is None:
            verdict = judged[(t, shard)] = index.stopped_between(
                shard, t + DURABLE_WITHIN, math.inf) and index.quiet(
                (f"shard-{shard}",), t - DURABLE_WITHIN, t + DURABLE_WITHIN)
        return verdict

    for e in index.history.of(h.Trimmed):
        if e.generation in index.shard_generations:
            continue  # a memory topic's: it dies with its shard
        for o in range(e.first, e.first + e.count):
            key = (e.topic, e.generation, o)
            earlier = first.get(key)
            if earlier is None:
                first[key] = (e.t, e.shard)
                continue
            t, shard = earlier
            if judge(t, shard) and index.stopped_between(shard, t + DURABLE_WITHIN, e.t):
                report.add("G9", "trim-undone", e.t,
                           f"{e.topic}@{o} (generation {e.generation:#x}) was deleted at"
                           f" {t:.3f} and again at {e.t:.3f}, after its shard restarted: the"
                           " deletion did not survive the restart")
    report.examine("G9", "trim-undone", sum(1 for t, shard in first.values() if judge(t, shard)))


def _check_storage_failures(index: Index, report: Report) -> None:
    """A shard's log fails (the shard exits, G9) only after a storage fault on its
    machine that may fail it: an fsync error or a power loss; never a full disk
    (publishes are refused and writes wait for room), nor a damaged record read back
    (its topic's log is recovered alone; the shard's other topics serve on). Sound: a
    simulated disk raises no error unless a fault says so, and damage raises none."""
    faults: dict[str, float] = {}   # host -> when the first fsync error hit it
    power: dict[str, float] = {}    # host -> its last power loss
    for e in index.history.of(h.FaultInjected):
        if e.fault == "power":
            power[e.target] = e.t
        elif e.fault in FAILING:
            faults.setdefault(e.target, e.t)
        elif e.fault == "storage-failed":
            report.examine("G9", "storage-failed-unexplained")
            # a power loss kills the shard at once: it explains a failure of the log it
            # cut short then, not of a later incarnation's
            if faults.get(e.target, math.inf) > e.t \
                    and not 0 <= e.t - power.get(e.target, -math.inf) <= index.params.latency:
                report.add("G9", "storage-failed-unexplained", e.t,
                           f"{e.target}: a log failed ({e.detail}) though no storage fault"
                           " hit its machine")


def _check_generation_kept(index: Index, report: Report) -> None:
    """A disk topic whose generation had an acked message keeps it across shard crashes,
    drains and router restarts: a change needs a power loss or damage on its shard's
    machine between the last evidence of the old generation and the first of the new.

    Sound under any delay: an acked publish means its record was written (and with
    fsync always, synced); recovery reads the generation from that record's segment
    header, and only damage (flip) or, with fsync interval or never, a reboot with
    unsynced data (power) may make it draw another. With fsync always a power loss
    loses nothing acked: a new generation after one means recovery had counted as
    durable what was not (a failed fsync's pages, read back from the page cache). A
    bit flipped while the shard runs (``rot``), and with fsync interval or never an
    fsync error (``eio``: recovery cuts the acked records past the last synced
    position), explain the change if it happened after the old generation began
    (its predecessor's last evidence): the recovery or creation that began it read,
    or wrote, every record it kept."""
    config = index.history.meta.get("config", {})
    shards = int(config.get("shards", 1) or 1)
    fsync = (config.get("storage") or {}).get("fsync", "always")
    resetting, latent = (RESETTING_ALWAYS, LATENT_ALWAYS) if fsync == "always" \
        else (RESETTING, LATENT)
    lat = index.params.latency
    # topic -> (generation, last evidence, last evidence of the generation before it)
    seen: dict[str, tuple[int, float, float]] = {}
    for e in index.history:
        if not isinstance(e, h.PublishAcked) or e.generation in index.shard_generations:
            continue
        previous = seen.get(e.topic)
        if previous is None or previous[0] == e.generation:
            seen[e.topic] = (e.generation, e.t, -math.inf if previous is None else previous[2])
            continue
        seen[e.topic] = (e.generation, e.t, previous[1])
        report.examine("G9", "generation-kept")
        host = f"shard-{shard_for(e.topic, shards)}"
        explained = any(host in d.hosts and d.begin <= e.t and (
                            (d.fault in resetting and previous[1] - lat <= d.begin)
                            or (d.fault in latent and previous[2] - lat <= d.begin))
                        for d in index.disturbances)
        if not explained:
            report.add("G9", "generation-kept", e.t,
                       f"disk topic {e.topic} went from generation {previous[0]:#x} (acked"
                       f" at {previous[1]:.3f}) to {e.generation:#x} with no"
                       f" {'damage' if fsync == 'always' else 'power loss, fsync error or damage'}"
                       f" on {host}{' (fsync always)' if fsync == 'always' else ''}")


def _check_payloads(index: Index, report: Report) -> None:
    """Every message delivered or fetched carries the payload its id was published with
    (a producer reuses an id only to retry the same payload). Sound under any delay and
    fault: nothing the broker does may change a payload, so a difference is damage
    that reached a reader (G9: a corrupt record is never delivered)."""
    published: dict[str, str] = {}
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            if e.payload is not None:
                published.setdefault(e.id, e.payload)
        elif isinstance(e, h.Delivered):
            expected = published.get(e.id)
            if expected is None or e.payload is None:
                continue
            report.examine("G9", "payload-changed")
            if e.payload != expected:
                report.add("G9", "payload-changed", e.t,
                           f"{e.subscriber} got {e.topic}@{e.offset} id={e.id!r} with payload"
                           f" {e.payload!r}; it was published with {expected!r}")
        elif isinstance(e, h.Fetched) and e.payloads:
            for offset, message_id, payload in zip(e.page(), e.ids, e.payloads, strict=False):
                expected = published.get(message_id)
                if expected is None:
                    continue
                report.examine("G9", "payload-changed")
                if payload != expected:
                    report.add("G9", "payload-changed", e.t,
                               f"{e.subscriber} fetched {e.topic}@{offset} id={message_id!r}"
                               f" with payload {payload!r}; it was published with {expected!r}")
