"""One fuzz run: start ``flux serve``, fuzz it over many connections, check, stop.

Each fuzzing connection sends batches of frames and reads what comes back,
skipping deliveries; answers come in request order (PROTOCOL.md §4), so each is
matched to its request: a frame with an integer rid must be answered with that
rid, one without with an error of rid 0; a CREDIT gets nothing unless it is
refused, so a PING follows it. Now and then a
connection ends with damaged bytes (:func:`fuzz.frames.corrupt`). A connection may
be closed by the broker only after a typed ERROR for a reason DESIGN.md lists
("Why a connection may close") that this connection gave: framing corruption
(ProtocolError, FrameTooLarge) after damaged bytes, UnsupportedVersion after a
HELLO of another version. Between rounds a good client publishes to memory and
disk topics through the real client library and reads every message back. At the
end no broker process may have died or been replaced.
"""

from __future__ import annotations

import collections
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from chaos.cluster import Cluster, ProcessGroup
from chaos.runner import free_ports
from flux import errors, protocol
from flux.client import trio as flux_trio
from flux.hashing import shard_for
from fuzz.frames import CLIENT_KINDS, Mutator, corrupt, expect, valid_frame

P = protocol
ANSWER_WAIT = 15.0        # seconds a request may wait for its answer
CORRUPT_CHANCE = 0.004    # per frame: end the connection with damaged bytes instead
# the reasons a shard or the router may close a connection, by the cause the fuzzer gave
CLOSE_AFTER_DAMAGE = {errors.ProtocolError.code, errors.FrameTooLarge.code}
CLOSE_AFTER_BAD_HELLO = {errors.UnsupportedVersion.code, errors.AuthenticationFailed.code}
DISK_PREFIX = "fz.disk"
# with --auth: who the HELLOs claim to be (tokens, a password), and how often
FUZZER_TOKEN, READER_TOKEN, ADMIN_TOKEN = "fz-fuzzer-token", "fz-reader-token", "fz-admin-token"
PASSWORD_USER, PASSWORD = "fz-pw", "fz-password"
CREDENTIALS: list[tuple[dict[str, Any], float]] = [
    ({"token": FUZZER_TOKEN}, 6),          # publish, subscribe and admin over fz.>
    ({"token": READER_TOKEN}, 2),          # subscribe to fz.mem.> only: NotAuthorized items
    ({"token": "not-a-token"}, 0.5),       # AuthenticationFailed, then the close
    ({}, 0.5),                             # no credential: likewise
    ({"user": PASSWORD_USER, "password": PASSWORD}, 0.5),   # the router only (a shard
    ({"user": PASSWORD_USER, "password": "wrong"}, 0.3),    # refuses passwords)
]


def auth_config(path: Path) -> None:
    """Write the ``auth`` section of an --auth run (a fast password hash: a fuzz run
    logs in often)."""
    from flux.auth.credentials import hash_password, token_digest

    users = [
        {"name": "fuzzer", "token_sha256": token_digest(FUZZER_TOKEN), "publish": ["fz.>"],
         "subscribe": ["fz.>"], "admin": ["fz.>"]},
        {"name": "reader", "token_sha256": token_digest(READER_TOKEN),
         "subscribe": {"allow": ["fz.mem.>"], "deny": ["fz.mem.t0"]}},
        {"name": PASSWORD_USER, "password": hash_password(PASSWORD, n=2**10),
         "publish": ["fz.mem.>"], "subscribe": ["fz.mem.>"]},
        {"name": "admin", "token_sha256": token_digest(ADMIN_TOKEN), "publish": [">"],
         "subscribe": [">"], "admin": [">"]},
    ]
    path.write_text(json.dumps({"auth": {"users": users, "logins_per_minute": 600}}))


@dataclass
class FuzzSettings:
    frames: int = 1_000_000
    connections: int = 24
    seed: int = 1
    shards: int = 2
    storage: str = "mixed"       # memory | disk | mixed (fz.disk.* on disk)
    rounds: int = 20             # good-client rounds, spread over the run
    auth: bool = False           # an auth section: HELLOs prove users, items are checked
    out: Path = Path("fuzz-results")


@dataclass
class Tally:
    """What happened, for the report and the verdict."""

    sent: collections.Counter[str] = field(default_factory=collections.Counter)
    mutations: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    closes: collections.Counter[str] = field(default_factory=collections.Counter)
    connections: int = 0
    damaged: int = 0
    good_rounds: int = 0
    good_messages: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def frames(self) -> int:
        return sum(self.sent.values())

    def violation(self, text: str) -> None:
        if len(self.violations) < 200:
            self.violations.append(text)


def _owned(shard: int, shards: int, prefix: str, count: int = 4) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{prefix}.t{i}"
        if shard_for(name, shards) == shard:
            out.append(name)
        i += 1
    return out


class _Conn:
    """One raw connection: send a frame or bytes, read frames, notice the close."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = P.FrameDecoder(1 << 30)
        self.frames: collections.deque[list[Any]] = collections.deque()
        self.last: list[Any] | None = None   # the last frame read
        self.closed = False

    async def next(self, deadline: float) -> list[Any] | None:
        """The next frame other than a delivery; None if the broker closed first."""
        while True:
            while self.frames:
                frame = self.frames.popleft()
                self.last = frame
                if frame and frame[0] not in (P.DELIVER, P.SUB_ENDED):
                    return frame
            if self.closed:
                return None
            with trio.move_on_at(deadline):
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    self.closed = True
                    continue
                self.frames.extend(self.decoder.feed(data))
                continue
            raise TimeoutError

    async def drain_until_closed(self, deadline: float) -> bool:
        """Read until the broker closes (True) or ``deadline`` (False)."""
        while not self.closed:
            try:
                if await self.next(deadline) is None:
                    return True
            except TimeoutError:
                return False
        return True


class Fuzzer:
    """The fuzzing connections of one run."""

    def __init__(self, s: FuzzSettings, router: str, shards: dict[int, str],
                 topics: dict[int, list[str]], tally: Tally) -> None:
        self.s = s
        self.router = router
        self.shards = shards
        self.topics = topics
        self.tally = tally
        self.left = s.frames

    async def worker(self, index: int) -> None:
        rng = random.Random(f"fuzz:{self.s.seed}:{index}")
        mutator = Mutator(rng)
        serial = 0
        while self.left > 0:
            to_router = rng.random() < 0.1
            shard = rng.randrange(self.s.shards)
            address = self.router if to_router else self.shards[shard]
            host, port = P.parse_address(address)
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                self.tally.violation(f"cannot connect to {address}: {exc}")
                await trio.sleep(0.5)
                continue
            self.tally.connections += 1
            conn = _Conn(stream)
            try:
                serial = await self._session(conn, rng, mutator, shard, to_router, index, serial)
            finally:
                await trio.aclose_forcefully(stream)

    async def _session(self, conn: _Conn, rng: random.Random, mutator: Mutator, shard: int,
                       to_router: bool, index: int, serial: int) -> int:
        """Batches of frames over one connection until it is closed (by either side)."""
        topics = self.topics[shard]
        first = True
        for _ in range(rng.randint(1, 40)):
            batch: list[tuple[list[Any], str]] = []
            for _ in range(rng.randint(1, 32)):
                if self.left <= 0:
                    break
                serial += 1
                rid = index * 10_000_000 + serial
                kind = P.HELLO if first else rng.choice(CLIENT_KINDS)
                first = False
                base = valid_frame(kind, rng, rid, rng.choice(topics), f"fz{index}.{serial}")
                if kind == P.HELLO and self.s.auth:
                    credential = rng.choices([c for c, _ in CREDENTIALS],
                                             [w for _, w in CREDENTIALS])[0]
                    base[2].update(credential)
                # a HELLO is mostly left whole, so that most connections get to the rest
                if kind == P.HELLO and rng.random() >= 0.2:
                    batch.append((base, "none"))
                else:
                    mutation = mutator.mutate(base)
                    batch.append((mutation.frame, mutation.how))
            if not batch:
                return serial
            if rng.random() < CORRUPT_CHANCE * len(batch):
                if batch[:-1] and not await self._requests(conn, batch[:-1]):
                    return serial
                await self._damage(conn, batch[-1][0], rng)
                return serial
            if not await self._requests(conn, batch):
                return serial
        return serial

    async def _requests(self, conn: _Conn, batch: list[tuple[list[Any], str]]) -> bool:
        """Send frames at once and check their answers, which come in order (PROTOCOL.md
        §4); a PING follows each CREDIT, which is answered only when refused. False once
        the connection is closed."""
        tally = self.tally
        data = bytearray()
        sent: list[tuple[list[Any], int | None, int | None]] = []   # frame, rid, probe
        for frame, how in batch:
            try:
                encoded = P.encode(frame)
            except (TypeError, ValueError, OverflowError):
                continue   # not encodable: nothing to send
            self.left -= 1
            kind = frame[0]
            tally.sent[P.KIND_NAMES.get(kind, "unknown") if type(kind) is int else "odd"] += 1
            tally.mutations[how] += 1
            data += encoded
            wanted = expect(frame)
            probe = None
            if wanted is None:
                probe = 2**62 + self.left
                data += P.encode([P.PING, probe])
            sent.append((frame, wanted, probe))
        try:
            await conn.stream.send_all(bytes(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return self._closed(conn, sent[0][0] if sent else [])
        deadline = trio.current_time() + ANSWER_WAIT
        # HELLOs of another version in this batch: the broker answers one with
        # UnsupportedVersion and closes, and what it still held for durability
        # before it is never answered (the connection is gone)
        bad_hellos = {f[1] for f, _, _ in sent if self._may_close(f) and len(f) > 1
                      and type(f[1]) is int}
        for frame, wanted, probe in sent:
            if not await self._answer(conn, frame, wanted, probe, deadline, bad_hellos):
                return False
        return True

    async def _answer(self, conn: _Conn, frame: list[Any], wanted: int | None,
                      probe: int | None, deadline: float, bad_hellos: set[int]) -> bool:
        """Read and check the answer to ``frame``; False once the connection is closed."""
        tally = self.tally
        while True:
            try:
                reply = await conn.next(deadline)
            except TimeoutError:
                tally.violation(f"no answer in {ANSWER_WAIT:g}s to {_short(frame)}")
                return False
            if reply is None:
                return self._closed(conn, frame)
            rid = reply[1] if len(reply) > 1 else None
            if reply[0] == P.ERROR and len(reply) > 2 and reply[2] in CLOSE_AFTER_BAD_HELLO \
                    and rid != wanted and rid in bad_hellos:
                # a later HELLO's refusal overtook replies held for durability: it closes
                if await conn.drain_until_closed(trio.current_time() + 3.0):
                    tally.closes[_code_name(reply)] += 1
                else:
                    tally.violation(f"UnsupportedVersion did not close: {_short(reply)}")
                return False
            if probe is not None:
                if rid == probe:
                    tally.answers["PONG (after CREDIT)"] += 1
                    return True
                if reply[0] == P.ERROR and rid == 0:
                    tally.answers[f"error {_code_name(reply)} (CREDIT)"] += 1
                    continue
            elif rid == wanted and type(rid) is int:
                tally.answers[_answer_name(reply)] += 1
                if reply[0] == P.ERROR and reply[2] in CLOSE_AFTER_BAD_HELLO:
                    # UnsupportedVersion to a HELLO: the broker closes the connection
                    if not await conn.drain_until_closed(trio.current_time() + 3.0):
                        tally.violation(f"UnsupportedVersion did not close: {_short(frame)}")
                    elif frame[0] != P.HELLO:
                        tally.violation(f"UnsupportedVersion to {_short(frame)}")
                    else:
                        tally.closes[_code_name(reply)] += 1
                    return False
                return True
            tally.violation(f"an answer {_short(reply)} that is not to {_short(frame)}")
            return False

    def _closed(self, conn: _Conn, frame: list[Any]) -> bool:
        """The broker closed the connection after ``frame``: a listed reason, given by it?"""
        last = conn.last
        code = last[2] if last is not None and last[0] == P.ERROR and len(last) > 2 else None
        if code in CLOSE_AFTER_BAD_HELLO and self._may_close(frame):
            self.tally.closes[_code_name(last)] += 1
        else:
            self.tally.violation(f"the connection was closed after {_short(frame)}; last frame"
                                 f" {_short(last)}")
        return False

    def _may_close(self, frame: list[Any]) -> bool:
        """Whether the broker may close the connection over ``frame``: a HELLO of another
        version, or with auth on any HELLO (its credential may be wrong, or mutated)."""
        return _bad_hello(frame) or (self.s.auth and bool(frame) and frame[0] == P.HELLO)

    async def _damage(self, conn: _Conn, frame: list[Any], rng: random.Random) -> None:
        """End the connection with damaged bytes; a close must come with its reason."""
        tally = self.tally
        self.left -= 1
        tally.damaged += 1
        try:
            data, how = corrupt(P.encode(frame), rng)
        except (TypeError, ValueError, OverflowError):
            return
        tally.mutations[f"bytes:{how}"] += 1
        verdict = _decodes(data)
        try:
            await conn.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        closed = await conn.drain_until_closed(trio.current_time() + 3.0)
        last = conn.last
        code = last[2] if last is not None and last[0] == P.ERROR and len(last) > 2 else None
        if closed:
            if code in CLOSE_AFTER_DAMAGE or (verdict == "frames" and code in
                                              CLOSE_AFTER_BAD_HELLO):
                tally.closes[_code_name(last)] += 1
            elif verdict == "corrupt":
                tally.violation(f"damaged bytes ({how}) closed the connection without"
                                f" ProtocolError or FrameTooLarge; last frame {_short(last)}")
            else:
                tally.violation(f"bytes that still decode ({how}) closed the connection;"
                                f" last frame {_short(last)}")
        elif verdict == "corrupt":
            tally.violation(f"damaged bytes ({how}) did not close the connection")


def _bad_hello(frame: list[Any]) -> bool:
    """A HELLO asking for another protocol version (or none)."""
    return bool(frame) and frame[0] == P.HELLO and not (
        len(frame) > 2 and isinstance(frame[2], dict) and frame[2].get("version") in P.SUPPORTED_VERSIONS
        and type(frame[2].get("version")) is int)


def _decodes(data: bytes) -> str:
    """What the broker's decoder makes of ``data``: "frames", "partial" or "corrupt"."""
    decoder = P.FrameDecoder()
    try:
        decoder.feed(data)
    except errors.ProtocolError:
        return "corrupt"
    return "partial" if decoder.pending else "frames"


def _code_name(frame: list[Any] | None) -> str:
    if frame is None or len(frame) < 3 or type(frame[2]) is not int:
        return "?"
    return type(errors.from_code(frame[2], "")).__name__


def _answer_name(frame: list[Any]) -> str:
    if frame[0] == P.ERROR:
        return f"error {_code_name(frame)}"
    return P.KIND_NAMES.get(frame[0], str(frame[0]))


def _short(frame: Any) -> str:
    text = repr(frame)
    return text if len(text) < 160 else text[:157] + "..."


async def good_round(url: str, n: int, topics: list[str], tally: Tally,
                     token: str | None = None) -> None:
    """Publish to each topic through the client library and read every message back."""
    async with flux_trio.connect(url, token=token) as client:
        for topic in topics:
            name = f"{topic}.r{n}"
            payloads = [f"{name}:{i}".encode() * (1 + i % 7) for i in range(200)]
            ids = [f"good-{name}-{i}" for i in range(200)]
            acks = await client.publish_many(name, payloads, ids=ids)
            first = acks[0].offset
            got: list[bytes] = []
            offset = first
            while len(got) < len(payloads):
                page = await client.fetch(name, offset)
                if not page.messages:
                    break
                got += [m.payload for m in page.messages]
                offset = page.messages[-1].offset + 1
            if got != payloads:
                tally.violation(f"good client: {name} read back {len(got)} messages, not the"
                                f" {len(payloads)} it published intact")
            tally.good_messages += len(payloads)
    tally.good_rounds += 1


async def run(s: FuzzSettings, workdir: Path, say: Any = print) -> Tally:
    """Start the broker, fuzz it, check it, stop it; every process is stopped on return."""
    tally = Tally()
    ports = free_ports(1 + s.shards)
    router_port, shard_ports = ports[0], ports[1:]
    data_dir = (workdir / "data").resolve()
    extra = []
    if s.storage == "disk":
        extra = ["--data-dir", str(data_dir)]
    elif s.storage == "mixed":
        policy = json.dumps([{"match": f"{DISK_PREFIX}.>", "storage": "disk"}])
        extra = ["--set", f"storage.dir={data_dir}", "--set", f"topics={policy}"]
    token = None
    if s.auth:
        auth_config(workdir / "auth.json")
        extra += ["--config", str((workdir / "auth.json").resolve())]
        token = ADMIN_TOKEN
    group = ProcessGroup(budget=3600.0)
    cluster = Cluster(group, workdir, port=router_port, shard_ports=shard_ports,
                      proxy_ports=shard_ports, settings=[], plant=None, extra_args=extra,
                      hello={"token": token} if token else None)
    url = f"flux://127.0.0.1:{router_port}"
    await group.start()
    try:
        async with trio.open_nursery() as nursery:
            await cluster.start_router(nursery)
            stats = await cluster.stats()
            assert stats is not None, "the router does not answer STATS"
            pids = {sh["index"]: sh["pid"] for sh in stats["shards"]}
            shards = {i: f"127.0.0.1:{p}" for i, p in enumerate(shard_ports)}
            prefixes = ["fz.mem"] + ([DISK_PREFIX] if s.storage != "memory" else [])
            topics = {i: [t for prefix in prefixes for t in _owned(i, s.shards, prefix)]
                      for i in range(s.shards)}
            good_topics = [f"fz.good.{k}" if k == "mem" else f"{DISK_PREFIX}.good"
                           for k in (["mem"] + (["disk"] if s.storage != "memory" else []))]
            say(f"fuzz: broker on {url} ({s.shards} shards, {s.storage} topics"
                f"{', auth on' if s.auth else ''}), pids {pids};"
                f" {s.frames:,} frames over {s.connections} connections, seed {s.seed}")
            fuzzer = Fuzzer(s, f"127.0.0.1:{router_port}", shards, topics, tally)
            started = time.monotonic()
            async with trio.open_nursery() as workers:
                for i in range(s.connections):
                    workers.start_soon(fuzzer.worker, i)
                every = max(1, s.frames // max(1, s.rounds))
                mark = s.frames
                n = 0
                while fuzzer.left > 0:
                    await trio.sleep(0.2)
                    if mark - fuzzer.left >= every:
                        mark = fuzzer.left
                        await good_round(url, n, good_topics, tally, token)
                        n += 1
                        say(f"fuzz: {tally.frames:,} frames, {tally.connections:,} connections,"
                            f" {len(tally.violations)} violations")
            await good_round(url, n, good_topics, tally, token)
            elapsed = time.monotonic() - started
            after = await cluster.stats()
            if after is None or not cluster.router_alive or cluster.crashes:
                tally.violation(f"the router died: {cluster.crashes}")
            else:
                for sh in after["shards"]:
                    if sh["pid"] != pids.get(sh["index"]) or sh.get("restarts"):
                        tally.violation(f"shard {sh['index']} was replaced (pid"
                                        f" {pids.get(sh['index'])} -> {sh['pid']},"
                                        f" {sh.get('restarts')} restarts)")
            say(f"fuzz: {tally.frames:,} frames in {elapsed:.1f}s"
                f" ({tally.frames / max(elapsed, 1e-9):,.0f}/s)")
            await cluster.stop()
            nursery.cancel_scope.cancel()
    finally:
        cluster.kill_shards()
        group.kill_all()
        with trio.CancelScope(shield=True):
            await group.reap()
        shutil.rmtree(data_dir, ignore_errors=True)
    return tally
