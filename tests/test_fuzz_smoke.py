"""The wire fuzzer: its mutations on their own, and a short run against a real broker
(``make fuzz`` runs a million frames)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from flux import protocol

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # fuzz/ is a tool beside the package, not installed
    sys.path.insert(0, str(ROOT))

from fuzz.frames import CLIENT_KINDS, Mutator, corrupt, expect, valid_frame  # noqa: E402

P = protocol


def test_every_client_kind_is_made_valid_and_mutated_every_way() -> None:
    rng = random.Random(3)
    mutator = Mutator(rng)
    hows: set[str] = set()
    for kind in CLIENT_KINDS:
        frame = valid_frame(kind, rng, 7, "fz.mem.t0", "tag")
        assert frame[0] == kind and P.decode_body(P.encode(frame)[4:]) == frame
        for _ in range(200):
            mutation = mutator.mutate(frame)
            hows.add(mutation.how)
            assert type(mutation.frame[0]) is int   # the kind stays an integer: well framed
    assert hows >= {"none", "replace", "drop", "add", "map", "group", "kind", "control"}


def test_what_an_answer_must_carry() -> None:
    assert expect([P.PING, 5]) == 5
    assert expect([P.PING, "5"]) == 0          # no integer rid: an error with rid 0
    assert expect([P.CREDIT, 3, 10]) is None   # no answer unless refused


def test_damaged_bytes_differ_from_what_was_encoded() -> None:
    rng = random.Random(1)
    data = P.encode([P.PING, 1])
    assert all(corrupt(data, rng)[0] != data for _ in range(50))


@pytest.mark.parametrize("auth", [False, True], ids=["open", "auth"])
def test_a_short_fuzz_run_against_a_real_broker_passes(tmp_path: Path, auth: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", "--frames", "15000", "--connections", "8",
         "--rounds", "3", "--out", str(tmp_path), *(["--auth"] if auth else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "PASS" in done.stdout
    if auth:  # items were refused and bad credentials closed connections
        [report] = tmp_path.glob("*/report.json")
        tally = json.loads(report.read_text())
        assert tally["answers"].get("error NotAuthorized", 0) > 0
        assert tally["closes"].get("AuthenticationFailed", 0) > 0
