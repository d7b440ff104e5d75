"""The open segments of one log, in position order: what the writer appends to and the reader reads.

Positions are byte positions in the log's record stream (segment headers excluded):
a record at position ``p`` of a segment whose first position is ``f`` sits at file
offset ``header_size + p - f``. In a compacted segment, JUMP records (the records
left out) move the positions on: after each, positions count again from its target,
which the segment notes with the file offset there (:meth:`OpenSegment.add_jump`).
"""

from __future__ import annotations

import bisect
import dataclasses
import os

from flux.host import DiskFile
from flux.storage.errors import NotInLog
from flux.storage.segment import SegmentHeader


@dataclasses.dataclass(slots=True)
class OpenSegment:
    """One segment file, open, with the end of what has been written to it."""

    path: str
    file: DiskFile
    header: SegmentHeader
    header_size: int
    end: int                  # log position after its last written record
    # a compacted segment's jumps: each target position, and the file offset it is at
    jumps: list[int] = dataclasses.field(default_factory=list)
    jump_offsets: list[int] = dataclasses.field(default_factory=list)
    # more open files of it, for the writer's overlapping fsyncs (closed with it)
    lanes: list[DiskFile] = dataclasses.field(default_factory=list)
    # the file's length as last known: its records, then any zeros written ahead (0: unknown)
    allocated: int = 0

    def close(self) -> None:
        """Close its file and its lanes."""
        self.file.close()
        self.close_lanes()

    def close_lanes(self) -> None:
        """Close the writer's other open files of it (no fsync runs on them)."""
        for lane in self.lanes:
            lane.close()
        self.lanes.clear()

    @property
    def first(self) -> int:
        return self.header.first_position

    @property
    def compacted(self) -> bool:
        return bool(self.jumps)

    def add_jump(self, target: int, offset: int) -> None:
        """Positions from ``target`` on are at file offsets from ``offset`` on."""
        self.jumps.append(target)
        self.jump_offsets.append(offset)

    def offset_of(self, position: int) -> int:
        """The file offset of log position ``position`` in this segment."""
        if self.jumps:
            i = bisect.bisect_right(self.jumps, position) - 1
            if i >= 0:
                return self.jump_offsets[i] + position - self.jumps[i]
        return self.header_size + position - self.header.first_position

    @property
    def saved(self) -> int:
        """Positions this segment spans beyond the bytes its file holds (compaction)."""
        if not self.jumps:
            return 0
        return self.end - self.first - (self.offset_of(self.end) - self.header_size)


class SegmentTable:
    """The segments of one log directory, oldest first."""

    def __init__(self, directory: str, segments: list[OpenSegment] | None = None,
                 start: int = 0) -> None:
        self.directory = directory
        self.segments: list[OpenSegment] = segments or []
        self._firsts = [s.first for s in self.segments]
        self._start = start

    def path_for(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def start(self) -> int:
        """The first position the log holds."""
        return self.segments[0].first if self.segments else self._start

    @property
    def end(self) -> int:
        """The position after the last record written."""
        return self.segments[-1].end if self.segments else self._start

    @property
    def last(self) -> OpenSegment | None:
        return self.segments[-1] if self.segments else None

    def add(self, segment: OpenSegment) -> None:
        """Add the newest segment (it starts where the last one ends)."""
        self.segments.append(segment)
        self._firsts.append(segment.first)

    def drop_first(self) -> OpenSegment:
        """Forget the oldest segment (its file is the caller's to close and remove)."""
        segment = self.segments.pop(0)
        self._firsts.pop(0)
        self._start = segment.end
        return segment

    def replace(self, old: OpenSegment, new: OpenSegment) -> None:
        """Put ``new`` (the same positions, e.g. compacted) in the place of ``old``."""
        i = next(i for i, s in enumerate(self.segments) if s is old)
        assert new.first == old.first and new.end == old.end
        self.segments[i] = new

    @property
    def saved(self) -> int:
        """Positions the log spans beyond the bytes its records take (compaction)."""
        return sum(s.saved for s in self.segments if s.jumps)

    def drop_last(self) -> OpenSegment:
        """Forget the newest segment (the writer replaces an empty one by a new header)."""
        self._firsts.pop()
        segment = self.segments.pop()
        self._start = self.segments[0].first if self.segments else segment.first
        return segment

    def find(self, position: int) -> OpenSegment:
        """The segment holding ``position``; raises NotInLog outside what was written."""
        i = bisect.bisect_right(self._firsts, position) - 1
        if i < 0 or position >= self.segments[i].end:
            raise NotInLog(f"position {position} is not in the log "
                           f"(it holds {self.start}..{self.end})")
        return self.segments[i]

    def after(self, segment: OpenSegment) -> OpenSegment | None:
        """The segment following ``segment``, if any."""
        i = bisect.bisect_left(self._firsts, segment.first) + 1
        return self.segments[i] if i < len(self.segments) else None

    def close(self) -> None:
        for s in self.segments:
            s.close()
