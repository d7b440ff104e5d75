"""The shard's data directory: its layout and checks, recovering every disk topic at
start, and running each disk topic's log writer (the shell side of G9).

Layout (``storage.dir``)::

    flux-data.json             {"format": 2, "shards": N}: whose directory this is
    shard-<i>/<topic>/          one log per disk topic (flux.storage segments)

A directory that is not Flux's, has another format, or was written with another
shard count is refused with an error naming the path and what to do; nothing in
it is ever wiped. A directory of format 1 (acks recorded as offsets) is read and
its marker moved to format 2 first (durably), so the Flux versions that read
format 1 only refuse it from then on instead of misreading the records written
as runs. A topic's directory that holds what is not that topic's log (a
file of another program, another format version, another owner's log) refuses
that topic alone: it is never written, requests for it get StorageUnavailable,
and the shard serves its other topics. A request naming a refused topic has its
directory looked at again (at most every ``RECHECK`` seconds, by the same
recovery): once an operator has moved what was not its log away, the topic
serves again without a restart. Each topic's writer runs as a task of the
shard and hands every move of its durable mark to the core itself
(``ShardCore.storage_progress``, called from the writer task as its fsync returns:
no other task wakes up for it).
A log that fails (an fsync or write error) fails what waits on it, and the
shard stops so that the router restarts it and recovery runs: after a failed
fsync the kernel's view of the file cannot be trusted (the fsync is never retried).
Damage read back (a record that fails its checksum, for a delivery, a FETCH or
compaction) is that topic's alone: its log is recovered while the shard's other
topics serve on (:meth:`ShardStorage.recover_topic`); requests for it get Busy
meanwhile, and damage that cut acked records starts its new generation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote

import trio

from flux.config import Config
from flux.errors import ConfigError, StorageUnavailable
from flux.hashing import DEAD_LETTER_SEP, dead_letter_parts
from flux.host import Disk, Host
from flux.shard.compaction_pace import CompactionPace
from flux.shard.core import ShardCore
from flux.shard.journal import TopicJournal
from flux.shard.replay import ReplayError, TopicReplay
from flux.storage import (
    ForeignLog,
    FsyncMode,
    LogFailed,
    LogReader,
    LogWriter,
    RecoveryReport,
    StorageError,
    recover,
)
from flux.storage.compaction import SLICE_BYTES, compact_segment
from flux.storage.recovery import owner_of_log
from flux.storage.table import OpenSegment, SegmentTable

log = logging.getLogger("flux.shard")

FORMAT_VERSION = 2
# older formats this Flux still reads: format 1 wrote a subscription's acks as offsets
# (CURSOR_V1, SNAPSHOT_V1), format 2 as runs; the marker is moved up before anything
# is written
READS_FORMATS = (1,)
MARKER = "flux-data.json"
NAME_MAX = 255     # bytes of a file name (most file systems)
HASHED = "~"       # a topic directory named by hash starts so (no topic name does)
OWNER = "topic "   # what a disk topic's segment headers name: OWNER + the topic
ROOM_CHECK = 1.0   # seconds between two looks at the data directory's free room
RECHECK = 5.0      # seconds: a refused topic's directory is looked at again at most so often


def directory_of_topic(name: str) -> str:
    """The directory name of a disk topic's log: the topic's name, except that a
    dead-letter topic's subscription part (any text, G11) is percent-encoded, dots
    included, so it is one safe path component; and a name longer than a file name
    may be (a dead-letter topic of a long topic and subscription) is ``~`` and its
    SHA-256 (the log's segment headers name the topic)."""
    parts = dead_letter_parts(name)
    if parts is None:
        entry = name
    else:
        topic, subscription = parts
        entry = f"{topic}{DEAD_LETTER_SEP}{quote(subscription, safe='').replace('.', '%2E')}"
    if len(entry.encode()) > NAME_MAX:
        return HASHED + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return entry


def topic_of_directory(entry: str) -> str | None:
    """The topic whose log is in directory ``entry`` (:func:`directory_of_topic` undone);
    None for a hashed name (its log's headers tell)."""
    if entry.startswith(HASHED):
        return None
    parts = dead_letter_parts(entry)
    if parts is None:
        return entry
    return f"{parts[0]}{DEAD_LETTER_SEP}{unquote(parts[1])}"


async def check_data_dir(disk: Disk, directory: str, shard_count: int,
                         checker: str = "router") -> None:
    """Make ``directory`` Flux's (if it is new or empty) or check that it is, for
    ``shard_count`` shards; a directory of an older format this Flux reads has its
    marker moved to this format (``checker`` names the temporary file it writes:
    the router or a shard). Raises ConfigError naming the path and what to do."""
    try:
        if not disk.exists(directory):
            disk.makedirs(directory)
        names = disk.listdir(directory)
    except OSError as exc:
        raise ConfigError("storage.dir", f"{directory}: cannot use it as the data directory:"
                                         f" {exc.strerror or exc}") from None
    marker = posixpath.join(directory, MARKER)
    if MARKER not in names:
        if names:
            raise ConfigError("storage.dir", f"{directory} is not empty and is not a Flux data"
                                             " directory (no flux-data.json); give an empty or"
                                             " new directory")
        await _write_marker(disk, marker, shard_count)
        return
    try:
        f = disk.open(marker)
        try:
            meta = json.loads(f.read_at(0, 1 << 16))
        finally:
            f.close()
        version, shards = meta["format"], meta["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("storage.dir", f"{marker} cannot be read ({exc}); restore it from"
                                         " a backup, or give another directory") from None
    if version != FORMAT_VERSION and version not in READS_FORMATS:
        readable = ", ".join(str(v) for v in (*READS_FORMATS, FORMAT_VERSION))
        raise ConfigError("storage.dir", f"{directory} has data format {version!r}; this"
                                         f" Flux reads formats {readable} only; run the"
                                         " Flux version that wrote it")
    if shards != shard_count:
        raise ConfigError("storage.dir", f"{directory} was written by {shards} shards; start"
                                         f" with --shards {shards} (changing the shard count"
                                         " over existing data is not supported yet)")
    if version != FORMAT_VERSION:
        await _upgrade_marker(disk, marker, shard_count, checker)
        log.warning("%s: data format %s moved to %s (its records are still read; Flux"
                    " versions that read format %s only refuse this directory now)",
                    directory, version, FORMAT_VERSION, version)


async def _upgrade_marker(disk: Disk, marker: str, shard_count: int, checker: str) -> None:
    """Replace the marker by one of this format, atomically: a new file, fsynced, renamed
    over it, then the directory fsynced (a crash leaves the old marker or the new one,
    never an empty one; the old one is only upgraded again)."""
    fresh = f"{marker}.{checker}.new"
    await _write_marker(disk, fresh, shard_count)
    disk.rename(fresh, marker)
    await disk.sync_dir(posixpath.dirname(marker))


async def _write_marker(disk: Disk, marker: str, shard_count: int) -> None:
    """Write the marker durably (the file, then its directory entry): a power loss must
    not leave segments in a directory that no longer says whose it is."""
    f = disk.open(marker, create=True)
    try:
        f.truncate(0)
        f.append(json.dumps({"format": FORMAT_VERSION, "shards": shard_count}).encode())
        await f.sync()
    finally:
        f.close()
    await disk.sync_dir(posixpath.dirname(marker))


@dataclass
class Recovered:
    """One disk topic's recovery, as logged and shown in STATS."""

    topic: str
    report: RecoveryReport
    records: int
    messages: int
    generation: int
    new_generation: str | None   # why recovery started a new generation, if it did


class ShardStorage:
    """The disk topics of one shard: recovery at start, then one writer task per log."""

    def __init__(self, host: Host, config: Config, index: int, shard_count: int,
                 new_generation: Callable[[], int]) -> None:
        assert config.storage.dir is not None
        self.host = host
        self.disk: Disk = host.disk
        self.config = config
        self.root = config.storage.dir
        self.shard_count = shard_count
        self._index = index
        self.directory = posixpath.join(self.root, f"shard-{index}")
        # where a log leaves the marker of a failed fsync when its own directory takes no
        # new file (a dead disk): the host's runtime directory, on another file system,
        # in a directory of this boot and of this data directory (G9 "fsyncgate")
        root_id = hashlib.sha256(self.root.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.spare = posixpath.join(host.runtime_dir, "fsync-failed", self.disk.boot_id(),
                                    root_id, f"shard-{index}")
        self.new_generation = new_generation
        self.journals: dict[str, TopicJournal] = {}
        self.writers: dict[str, LogWriter] = {}
        self.recovered: list[Recovered] = []
        # topic directories (entries) that hold what is not their topic's log, and why:
        # never written, their topics refused until a look again finds their log
        # (:meth:`recheck`); and when each was last looked at (host clock)
        self.refused: dict[str, str] = {}
        self._looked_at: dict[str, float] = {}
        self.failure: LogFailed | None = None
        self.failed_what = f"the disk topics in {self.directory}"  # what ``failure`` hit
        self._unsettled: list[LogWriter] = []  # logs of new generations to sync first
        # each running log's task: its cancel scope, and set once it has ended
        self._logs: dict[str, tuple[trio.CancelScope, trio.Event]] = {}
        # each log's retention task (removals, compactions): stopped first at a clean stop
        self._retaining: dict[str, trio.CancelScope] = {}
        self._checked = False
        self._running = False   # run() started the writers (close() waits for them)
        self.failed = trio.Event()
        self.pace = CompactionPace(host, config.storage.compaction_rate)
        # a compaction pauses at least eight times a segment (small segments too)
        self._slice_bytes = min(SLICE_BYTES, max(512, config.storage.segment_bytes // 8))
        self._core: ShardCore | None = None
        self._dispatch: Callable[[], None] = lambda: None
        self._nursery: trio.Nursery | None = None

    def _writer(self, name: str, table: SegmentTable, generation: int) -> LogWriter:
        st = self.config.storage
        host = self.host
        writer = LogWriter(self.disk, table, owner=f"{OWNER}{name}", generation=generation,
                           boot_id=self.disk.boot_id(), fsync=FsyncMode(st.fsync),
                           fsync_interval=st.fsync_interval, segment_bytes=st.segment_bytes,
                           now=host.now, wall_time=host.wall_time)
        if self._core is not None:  # every log of the shard counts in one histogram (STATS)
            writer.stats.sync_times = self._core.fsync_times
        writer.on_full = lambda reason: self._check_room()
        writer.spare = posixpath.join(self.spare, directory_of_topic(name))
        return writer

    async def check(self) -> None:
        """Check the data directory (and make this shard's). Raises ConfigError for a
        directory that is not this broker's."""
        await check_data_dir(self.disk, self.root, self.shard_count,
                             posixpath.basename(self.directory))
        self.disk.makedirs(self.directory)
        self._checked = True

    async def recover(self, core: ShardCore) -> None:
        """Rebuild every disk topic of this shard into ``core`` (before it serves), saying
        how far it got in ``core.recovering`` meanwhile. Raises ConfigError for a directory
        that is not this broker's; a topic directory that holds what is not its topic's
        log refuses that topic alone (:meth:`_refuse`)."""
        if not self._checked:
            await self.check()
        self._core = core
        core.open_journal = self.open_new
        core.on_refused = self.recheck
        names = self.disk.listdir(self.directory)
        read = 0
        for i, name in enumerate(names):
            core.recovering = f"topic {i + 1} of {len(names)}, {read} bytes read so far"
            done = len(self.recovered)
            await self._recover_topic(core, name)
            if len(self.recovered) > done:
                read += self.recovered[-1].report.bytes

    async def _recover_topic(self, core: ShardCore, entry: str, found: str | None = None
                             ) -> None:
        """Recover the log in directory ``entry`` into ``core``; ``found``: the damage
        read back that made the shard recover it while serving."""
        host = self.host
        path = posixpath.join(self.directory, entry)
        name = topic_of_directory(entry)
        if name is None:  # a hashed directory: its segment headers name the topic
            owner = owner_of_log(self.disk, path)
            if owner is None or not owner.startswith(OWNER) \
                    or directory_of_topic(owner[len(OWNER):]) != entry:
                self._refuse(core, entry, path, ForeignLog(
                    path, "names no topic it could hold (no readable segment header, or"
                          " another topic's)"))
                return
            name = owner[len(OWNER):]
        settings = core.config.settings_for(name)
        if settings.storage != "disk":
            log.info("shard %d: topic %r stays on disk (it was made a disk topic; its policy"
                     " now says %s)", core.index, name, settings.storage)
        epoch = core.epoch
        started = host.now()
        replay = TopicReplay(name, settings, epoch, now=started)
        try:
            table, report = await recover(self.disk, path, owner=f"{OWNER}{name}",
                                          on_record=replay.feed, now=host.now,
                                          boot_id=self.disk.boot_id(),
                                          spare=posixpath.join(self.spare, entry))
        except ForeignLog as exc:
            self._refuse(core, entry, name, exc)
            return
        why: str | None = None
        generation = report.generation
        segments = table.segments
        if report.damage is not None and report.damage.kind == "corrupt":
            why = f"damage in its log lost records ({report.damage.reason})"
        elif generation is None:
            why = "its log held no record"
        elif len(segments) > 1 and segments[-1].end == segments[-1].first \
                and segments[-2].header.generation != generation:
            # a new generation's segment was made, and the shard stopped before its first
            # snapshot was written: what was replayed is the older generation's state, of
            # no meaning in this one (and no client heard of it: that snapshot is synced
            # before the shard serves)
            why = "a new generation began and the shard stopped before its first snapshot"
        elif report.exposed_past_mark:
            why = (f"an fsync of its log failed, and records acked past the last synced"
                   f" position ({report.synced_mark}) may not be on disk: cut there")
        elif generation in report.damaged_generations:
            why = "an earlier recovery set damage aside and stopped before a new generation"
        elif self._boot_changed(report):
            why = (f"the machine restarted since its log was written, and with"
                   f" storage.fsync={self.config.storage.fsync} the unsynced tail may be lost")
        if why is not None:
            generation = self.new_generation()
        assert generation is not None
        for _ in replay.remember_window():   # (heartbeats and Busy answers go on)
            await trio.lowlevel.checkpoint()
        topic = replay.build(generation, host.now(), reset=why is not None)
        seconds = host.now() - started
        writer = self._writer(name, table, generation)
        journal = self._journal(name, writer, topic.log.next_offset)
        journal.published.extend(replay.published)
        journal.droppable = table.start
        journal.trimmed_to = topic.log.oldest
        journal.kept = replay.kept_positions()
        topic.journal = journal
        self.journals[name], self.writers[name] = journal, writer
        info = {"recovered_bytes": report.bytes, "recovered_records": replay.records,
                "recovery_seconds": seconds, "new_generation": why,
                "damage_read_back": found,
                "fsync_failed": None if report.synced_mark is None else {
                    "cut_at": report.synced_mark, "unsynced_bytes": report.unsynced_bytes},
                "damage": None if report.damage is None else {
                    "kind": report.damage.kind, "path": report.damage.path,
                    "position": report.damage.position, "reason": report.damage.reason,
                    "set_aside": list(report.damage.set_aside)}}
        core.adopt_recovered(topic, host.now(), info)
        last = table.segments[-1] if table.segments else None
        if why is not None or (last is not None and last.end == last.first):
            # the new generation must be on disk before anyone hears of it: a snapshot
            # starts a segment of that generation (synced in run, before serving). So
            # must an empty last segment (a crash right after it was made, or a torn
            # first record cut): every segment starts with a snapshot, or dropping the
            # ones before it would lose the subscriptions they record
            journal.append(*core._snapshot(topic))
            self._unsettled.append(writer)
        self.recovered.append(Recovered(name, report, replay.records, replay.messages,
                                        generation, why))
        damage = f"; {report.damage.kind} at position {report.damage.position}: " \
                 f"{report.damage.reason}" if report.damage is not None else ""
        if report.synced_mark is not None:
            damage += (f"; an fsync had failed: cut at the synced position"
                       f" {report.synced_mark}, {report.unsynced_bytes} bytes past it set aside")
        log.info("shard %d: recovered topic %r in %.3fs: read %d bytes, %d records, %d messages,"
                 " %d subscriptions; offsets %d..%d; generation %#x%s%s", core.index, name,
                 seconds, report.bytes, replay.records, replay.messages, len(topic.subs),
                 topic.log.oldest, topic.log.next_offset, generation,
                 f" (new: {why})" if why else "", damage)

    def _refuse(self, core: ShardCore, entry: str, topic: str, exc: ForeignLog) -> None:
        """Leave topic directory ``entry`` as it is and refuse ``topic`` (its name, or the
        directory's path when it names none): what is in it is not that topic's log.
        Logged once (a look again that still finds it so says nothing more)."""
        again = entry in self.refused
        self.refused[entry] = str(exc)
        self._looked_at[entry] = self.host.now()
        core.refuse(topic, str(exc))
        if again:
            log.debug("shard %d: %s is still refused: %s", core.index, entry, exc)
            return
        log.error("shard %d: %s is refused and its directory left untouched (the shard serves"
                  " its other topics): %s", core.index,
                  "a topic" if topic == exc.path else f"topic {topic!r}", exc)

    def _journal(self, name: str, writer: LogWriter, exposed: int) -> TopicJournal:
        """A disk topic's journal: its writer, and a reader of its durable records (what
        evicted payloads are read back through, each read checksum-verified)."""
        journal = TopicJournal(name, writer, exposed=exposed,
                               reader=LogReader(writer.table, limit=lambda: writer.durable))
        journal.on_damage = self._damaged
        return journal

    def _damaged(self, journal: TopicJournal, reason: str) -> None:
        """A record read back failed its checks: recover that topic's log alone (recovery
        sets the damage aside and starts a new generation if it cut acked records, G9).
        Before the shard serves, there is no other topic to spare: the shard stops."""
        name = journal.topic
        core = self._core
        if self._nursery is None or core is None:
            if self.failure is None:
                self.failure = LogFailed(f"damage read back: {reason}")
                self.failed_what = self._log_of(name)
            self.failed.set()
        elif self.journals.get(name) is journal and name not in core.down:
            self._nursery.start_soon(self.recover_topic, journal, reason)

    async def recover_topic(self, journal: TopicJournal, reason: str) -> None:
        """Recover ``journal``'s topic alone while the shard serves: take it down in the
        core, stop its log, run recovery on its directory and adopt what it rebuilt. If
        the disk fails meanwhile, the shard stops (its restart recovers every topic)."""
        core = self._core
        assert core is not None and self._nursery is not None
        name = journal.topic
        log.error("shard %d: topic %r: %s; recovering its log while the shard's other topics"
                  " serve on (requests for it get Busy meanwhile)", core.index, name, reason)
        core.take_down(name, reason, self.host.now())   # nothing more is appended
        self._dispatch()
        try:
            # what it queued is written and synced: recovery reads it, so nothing the
            # shard did (a trim, a deletion) comes undone unless the damage cuts it
            await self.writers[name].close()
            running = self._logs.pop(name, None)
            if running is not None:
                scope, ended = running
                scope.cancel()
                await ended.wait()
            del self.journals[name], self.writers[name]
            await self._recover_topic(core, directory_of_topic(name), found=reason)
            if name in core.refused:   # its directory no longer holds its log
                self._dispatch()
                return
            await self._start_recovered(name)
        except (OSError, StorageError, ReplayError) as exc:
            self.recovery_failed(exc)
            return
        core.bring_up(name)
        self._dispatch()

    async def _start_recovered(self, name: str) -> None:
        """Run the log of ``name``, recovered while the shard serves; a new generation's
        first snapshot is synced before anyone hears of it."""
        assert self._nursery is not None
        writer = self.writers[name]
        self._nursery.start_soon(self._serve_log, self.journals[name], writer)
        if writer in self._unsettled:
            self._unsettled.remove(writer)
            await writer.sync()

    def recheck(self, name: str) -> None:
        """A request named disk topic ``name``, refused because its directory held what
        is not its log: look at that directory again in the background, at most once
        every ``RECHECK`` seconds (the request itself is refused meanwhile)."""
        entry = directory_of_topic(name)
        if entry not in self.refused or self._nursery is None:
            return
        now = self.host.now()
        if now < self._looked_at.get(entry, -RECHECK) + RECHECK:
            return
        self._looked_at[entry] = now
        self._nursery.start_soon(self._look_again, entry)

    async def _look_again(self, entry: str) -> None:
        """Run recovery on refused topic directory ``entry`` again, through the disk seam
        and by the same rules as at start (14.2 rule 3: what is not this topic's log
        refuses it again, left untouched). Once it holds the topic's log, or nothing,
        the topic serves again; a directory that is empty or gone lets it be made anew
        (a hashed one names its topic only in its segments' headers)."""
        core = self._core
        assert core is not None and self._nursery is not None
        path = posixpath.join(self.directory, entry)
        name = topic_of_directory(entry)
        key = path if name is None else name   # how the core knows the refusal
        try:
            if not self.disk.exists(path) or not self.disk.listdir(path):
                self._serve_again(entry, key)
                log.warning("shard %d: refused topic directory %s is empty or gone now: its"
                            " topic is served again, made anew when a request names it",
                            core.index, path)
                return
            await self._recover_topic(core, entry)
            name = next((n for n in self.journals if directory_of_topic(n) == entry), None)
            if name is None:
                return   # still not its log: refused again
            await self._start_recovered(name)
        except (OSError, StorageError, ReplayError) as exc:
            self.recovery_failed(exc)
            return
        self._serve_again(entry, key)
        log.warning("shard %d: topic %r serves again: its directory %s now holds its log",
                    core.index, name, path)
        self._dispatch()

    def _serve_again(self, entry: str, key: str) -> None:
        """Refused directory ``entry`` (``key`` in the core's refusals) is refused no more."""
        assert self._core is not None
        self.refused.pop(entry, None)
        self._looked_at.pop(entry, None)
        self._core.serve_again(key)

    def _boot_changed(self, report: RecoveryReport) -> bool:
        """Whether the log's unsynced tail may be gone: it was written before the
        machine's last reboot, and not every record was fsynced before its ack."""
        return report.boot_id != self.disk.boot_id() and self.config.storage.fsync != "always"

    def open_new(self, name: str, start: int) -> TopicJournal:
        """A new disk topic's journal (the core calls this when it makes the topic).
        Raises StorageUnavailable if its directory cannot be made or was refused."""
        entry = directory_of_topic(name)
        path = posixpath.join(self.directory, entry)
        if entry in self.refused:   # never write where another program's data is
            self.recheck(name)
            raise StorageUnavailable(f"topic {name!r} cannot be served: {self.refused[entry]}")
        try:
            self.disk.makedirs(path)
        except OSError as exc:
            raise StorageUnavailable(f"cannot make the log directory of topic {name!r}:"
                                     f" {exc.strerror or exc}") from None
        writer = self._writer(name, SegmentTable(path, start=0), self.new_generation())
        journal = self._journal(name, writer, start)
        journal.trimmed_to = start
        self.journals[name], self.writers[name] = journal, writer
        if self._nursery is not None:
            self._nursery.start_soon(self._serve_log, journal, writer)
        return journal

    async def run(self, dispatch: Callable[[], None], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every writer (and those of topics made later) until cancelled."""
        self._dispatch = dispatch
        self._running = True
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for name, journal in self.journals.items():
                nursery.start_soon(self._serve_log, journal, self.writers[name])
            nursery.start_soon(self._watch_room)
            for writer in self._unsettled:
                await writer.sync()  # raises LogFailed: the shard does not start
            self._unsettled.clear()
            task_status.started()
            await trio.sleep_forever()

    def recovery_failed(self, exc: BaseException) -> None:
        """The disk failed while recovering or before serving: the shard exits unserved."""
        log.error("shard: recovering the disk topics failed: %s", exc)
        if self.failure is None:
            self.failure = exc if isinstance(exc, LogFailed) else LogFailed(
                f"recovery failed: {exc}", cause=exc)
        self.failed.set()

    def _log_of(self, name: str) -> str:
        path = posixpath.join(self.directory, directory_of_topic(name))
        return f"the log of topic {name!r} in {path}"

    def failure_line(self) -> str:
        """One line for the shard's exit: what failed, where, and what happens next."""
        return (f"{self.failed_what} failed ({self.failure}); the shard exits, and the"
                " router restarts it: its recovery reads every disk topic's log back")

    def _check_room(self) -> None:
        """Tell the core whether disk topics may take publishes: not while the disk holds
        less than ``storage.reserved_bytes`` free (that room is for acks, commits and
        compaction, so a full disk never deadlocks them), nor while a write found it full."""
        core = self._core
        if core is None:
            return
        reserved = self.config.storage.reserved_bytes
        full = next((w.full for w in self.writers.values() if w.full is not None), None)
        reason: str | None = None
        if full is not None:
            reason = f"the disk is full ({full})"
        else:
            try:
                free = self.disk.free_bytes(self.root)
            except OSError as exc:
                free, reserved = 0, 1
                log.warning("shard %d: cannot tell the free room of %s: %s", core.index,
                            self.root, exc)
            if free < reserved:
                reason = (f"the disk holding {self.root} has {free} bytes free, under"
                          f" storage.reserved_bytes={reserved}")
        if reason != core.disk_full:
            if reason is None:
                log.info("shard %d: disk topics take publishes again (room on the disk)",
                         core.index)
            elif core.disk_full is None:
                log.warning("shard %d: disk topics refuse publishes: %s", core.index, reason)
            core.disk_full = reason

    async def _watch_room(self) -> None:
        """Check the disk's free room every ROOM_CHECK seconds."""
        host = self.host
        while True:
            self._check_room()
            await host.sleep_until(host.now() + ROOM_CHECK)

    async def _serve_log(self, journal: TopicJournal, writer: LogWriter) -> None:
        ended = trio.Event()
        with trio.CancelScope() as scope:
            self._logs[journal.topic] = (scope, ended)
            try:
                await self._run_log(journal, writer)
            finally:
                ended.set()
                if self._logs.get(journal.topic) == (scope, ended):
                    del self._logs[journal.topic]

    async def _run_log(self, journal: TopicJournal, writer: LogWriter) -> None:
        core = self._core
        assert core is not None
        mark = writer.durable

        def progress() -> None:
            # in the writer task, right after its fsync (or write): a reply held for
            # durability goes out without another task waking up first
            nonlocal mark
            if writer.durable > mark:
                mark = writer.durable
                core.storage_progress(journal, self.host.now())
                self._dispatch()

        writer.on_progress = progress
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            nursery.start_soon(self._retain, journal, writer)
            exc = await writer.wait_failed()
            log.error("shard %d: the log of topic %r failed: %s", core.index, journal.topic, exc)
            if writer.unmarked:
                log.critical("shard %d: an fsync of topic %r's log failed and no marker could"
                             " be left in %s nor in %s: a restart in this boot would read back"
                             " records that may not be on disk; check the disk, and cut the"
                             " log at position %d or reboot the machine before restarting",
                             core.index, journal.topic, writer.table.directory, writer.spare,
                             writer.synced)
            core.storage_stopped(journal, str(exc), self.host.now())
            self._dispatch()
            if self.failure is None:
                self.failure = exc
                self.failed_what = self._log_of(journal.topic)
            self.failed.set()
            nursery.cancel_scope.cancel()

    async def _retain(self, journal: TopicJournal, writer: LogWriter) -> None:
        """Every cleanup period, remove the log's whole segments that hold nothing live
        (the cleanup pass moves ``journal.droppable``; never the one being written),
        then compact the sealed segments before the first message still held."""
        with trio.CancelScope() as scope:
            self._retaining[journal.topic] = scope
            try:
                await self._retain_every_period(journal, writer)
            finally:
                if self._retaining.get(journal.topic) is scope:
                    del self._retaining[journal.topic]

    async def _retain_every_period(self, journal: TopicJournal, writer: LogWriter) -> None:
        period = self.config.message.cleanup_time
        host = self.host
        tried: set[int] = set()   # segments judged once (what they hold only ages out)
        while True:
            await host.sleep_until(host.now() + period)
            if journal.failed is not None:
                continue
            try:
                if journal.droppable > writer.table.start:
                    # the snapshot that starts the first segment kept must be durable
                    # before what it replaces goes (fsync never or interval included)
                    await writer.sync()
                    await self._drop(journal, writer)
                await self._compact(journal, writer, tried)
            except LogFailed:
                return  # the log's watcher fails what waits and stops the shard
            except OSError as exc:  # the log itself is fine: try again next period
                log.warning("shard: removing or compacting old segments of topic %r failed:"
                            " %s", journal.topic, exc)
            except StorageError as exc:  # a sealed segment reads back damaged
                self._damaged(journal, f"compaction read a damaged record: {exc}")
                return

    async def _drop(self, journal: TopicJournal, writer: LogWriter) -> None:
        """Remove the log's whole segments before ``journal.droppable``, saying how many,
        how big and how long it took."""
        table = writer.table
        host = self.host
        gone = [s for s in table.segments[:-1] if s.end <= journal.droppable]
        started = host.now()
        await writer.drop_before(journal.droppable)
        if gone:
            log.info("shard %d: removed %d segment(s) of topic %r, %d bytes, in %.1f ms",
                     self._index, len(gone), journal.topic,
                     sum(s.offset_of(s.end) for s in gone), (host.now() - started) * 1000)

    async def _compact(self, journal: TopicJournal, writer: LogWriter, tried: set[int]) -> None:
        """Compact (G9 space) each sealed segment that lies wholly before the first message
        still held and is not about to go whole: its payloads and cursors are left out,
        the ids still in the dedup window kept (``TopicJournal.judge``)."""
        table = writer.table
        live_end = journal.first_live_end()
        candidates = []
        for segment in table.segments[:-1]:
            if live_end is not None and segment.end >= live_end:
                break
            if segment.first not in tried and not self._goes_whole_soon(journal, segment):
                candidates.append(segment)
        if not candidates:
            return
        # the snapshot starting each next segment (what lets cursors go) must be durable
        await writer.sync()
        pace = self.pace
        for segment in candidates:
            async with pace.turn:   # one compaction of the shard at a time
                if all(s is not segment for s in table.segments) or journal.failed is not None:
                    return
                if self._goes_whole_soon(journal, segment):  # (its turn came late)
                    continue
                tried.add(segment.first)
                started = self.host.now()
                done = await compact_segment(self.disk, table, segment, journal.judge,
                                             slice_bytes=self._slice_bytes, pace=pace.spend)
            took = (self.host.now() - started) * 1000
            if done.rewritten:
                journal.compactions += 1
                journal.compacted_bytes += done.before - done.after
                log.info("shard %d: compacted a segment of topic %r in %.0f ms: wrote %d bytes"
                         " in place of %d (%d records: %d kept, %d as ids)", self._index,
                         journal.topic, took, done.after, done.before, done.records, done.kept,
                         done.replaced)
            else:
                log.info("shard %d: left a segment of topic %r as it was (%d bytes: a rewrite"
                         " would save under a quarter), judged in %.0f ms", self._index,
                         journal.topic, done.before, took)

    def _goes_whole_soon(self, journal: TopicJournal, segment: OpenSegment) -> bool:
        """Whether every id in ``segment`` leaves the dedup window within two cleanup
        passes (it is then removed whole: compacting it first is wasted work)."""
        soon = journal.forgotten_before + 2 * self.config.message.cleanup_time
        last_wall = journal.last_wall_before(segment.end)
        return last_wall is not None and last_wall < soon

    async def close(self) -> None:
        """Write and fsync what every log has queued, then close them (a clean stop)."""
        if not self._running:   # recovery failed: no writer ran, and none wrote anything
            for writer in self.writers.values():
                writer.table.close()
            return
        for scope in list(self._retaining.values()):
            scope.cancel()   # a compaction under way leaves its segment as it was
        for name, writer in list(self.writers.items()):
            try:
                await writer.close()
            except (LogFailed, StorageError, OSError) as exc:
                log.error("shard: closing the log of topic %r failed: %s", name, exc)
