"""Traces: the reference's own trace is valid; a trace with each expressible bug class
planted is refused with the property it breaks, at the line that shows it."""

import functools
import hashlib
import io
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoracle.oracle.cli import main
from kvoracle.oracle.mutants import SelfPreempt, StarvingAdmit
from kvoracle.oracle.trace import TraceFormatError, check_trace, read_lines, record, record_scheduler
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.hashing import block_hashes

H1, H2 = block_hashes([1, 1, 2, 2], 2)
HEAD = json.dumps({"format": "kvoracle-trace", "version": 1, "gpu_blocks": 4, "cpu_blocks": 2})
GOOD: dict[str, object] = {"gpu_free": [2, 3], "cpu_free": [0, 1], "refcounts": {str(H1): 0, str(H2): 0},
        "gpu_findable": [H2], "cpu_findable": [],
        "counters": {"gpu_free": 2, "cpu_free": 2, "gpu_evictable": 1, "cpu_evictable": 0, "gpu_in_use": 2}}


def trace(last_observe: dict[str, object] | None = None, extra: Sequence[dict[str, object]] = ()) -> list[str]:
    """r0 caches two blocks and finishes; the last event reports `last_observe`."""
    events: list[dict[str, object]] = [
        {"op": "match", "request": 0, "hashes": [H1, H2]},
        {"op": "allocate", "request": 0, "blocks": [0, 1]},
        {"op": "commit", "request": 0, "hashes": [H1, H2]},
        {"op": "release", "request": 0, "writes": []},
        *extra,
    ]
    if last_observe is not None:
        events[3]["observe"] = last_observe
    return [HEAD, *map(json.dumps, events)]


def test_the_reference_records_a_valid_trace() -> None:
    buf = io.StringIO()
    n = record(buf, steps=400, seed=3)
    report = check_trace(read_lines(io.StringIO(buf.getvalue())))
    assert report.passed and report.events == n >= 400


def test_a_correct_observation_passes() -> None:
    assert check_trace(trace(GOOD)).passed


COUNTERS = {"gpu_free": 2, "cpu_free": 2, "gpu_evictable": 1, "cpu_evictable": 0, "gpu_in_use": 2}
PLANTED: dict[str, tuple[dict[str, object], str]] = {
    "1 heap drop: evictable node not findable": ({**GOOD, "gpu_findable": []}, "INV-HEAP-COMPLETE"),
    "2/3 exit leak: released blocks never return": ({**GOOD, "gpu_free": [3]}, "INV-CONSERVE"),
    "4 double free: a block twice on the free list": ({**GOOD, "gpu_free": [2, 3, 3]}, "INV-CONSERVE"),
    "5 refcount underflow": ({**GOOD, "refcounts": {str(H1): -1, str(H2): 0}}, "INV-REFCOUNT"),
    "6 counter drift": ({**GOOD, "counters": {**COUNTERS, "gpu_evictable": 2}}, "INV-COUNTERS"),
    "7 GPU id in the CPU free list": ({**GOOD, "cpu_free": [0, 1, 3]}, "INV-TIER"),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_observation_is_refused(name: str) -> None:
    obs, prop = PLANTED[name]
    report = check_trace(trace(obs))
    assert report.violations and report.violations[0].id == prop, report.violations
    assert report.line == 5 and len(report.prefix) == 5


def test_use_after_free_is_refused() -> None:
    """9: a block still listed by r1 appears on the free list."""
    lines = [HEAD, *map(json.dumps, [
        {"op": "match", "request": 1, "hashes": []},
        {"op": "allocate", "request": 1, "blocks": [0]},
        {"op": "commit", "request": 1, "hashes": [], "observe": {"gpu_free": [0, 1, 2, 3]}},
    ])]
    report = check_trace(lines)
    assert report.violations[0].id == "INV-NO-UAF" and report.line == 4


@pytest.mark.parametrize("event, why", [
    ({"op": "complete", "transfer": 7, "outcome": "ok"}, "unknown transfer"),  # 10/11: late completion
    ({"op": "release", "request": 0, "writes": []}, "unknown request"),  # 5: unlock twice
    ({"op": "evict", "steps": [["drop", H2]]}, "CPU tier has room"),  # 12: eviction that skips the CPU tier
    ({"op": "allocate", "request": 0, "blocks": [2]}, "unknown request"),
])
def test_an_event_the_spec_forbids_is_refused(event: dict[str, object], why: str) -> None:
    report = check_trace(trace(extra=[event]))
    assert report.violations[0].id == "PRECONDITION" and why in report.violations[0].message
    assert report.line == 6


def test_a_block_id_outside_the_tier_is_named_out_of_range() -> None:
    report = check_trace(trace(extra=[{"op": "match", "request": 5, "hashes": []},
                                      {"op": "allocate", "request": 5, "blocks": [4]}]))
    assert report.violations[0].id == "PRECONDITION"
    assert "block 4 is out of range: the tier has blocks 0 to 3" in report.violations[0].message


def test_blank_lines_are_skipped_and_every_line_keeps_its_number(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text("\n\n".join(trace({**GOOD, "gpu_free": [3]})) + "\n")  # a blank line after each line
    report = check_trace(read_lines(spaced.read_text().splitlines()))
    assert report.violations[0].id == "INV-CONSERVE" and (report.events, report.line) == (4, 9)
    assert main(["check-trace", str(spaced)]) == 1
    out = capsys.readouterr().out
    assert "first violation at line 9, after 4 events" in out and "prefix that shows it (5 lines)" in out
    assert [line.split()[0] for line in out.split("shows it")[1].splitlines()[1:]] == ["1", "3", "5", "7", "9"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n\n".join([*trace()[:2], "not json"]) + "\n")
    assert main(["check-trace", str(bad)]) == 2
    assert "line 5: " in capsys.readouterr().err


@pytest.mark.parametrize("text, why", [
    ("not json", "not JSON"),
    (json.dumps({"op": "fly"}), "unknown op"),
    (json.dumps({"op": "complete", "transfer": 0, "outcome": "maybe"}), "unknown outcome"),
    (json.dumps({"op": "complete", "transfer": 0, "outcome": ["partial", -1]}), "unknown outcome"),
    (json.dumps({"op": "release", "request": True}), "request must be an integer"),
    (json.dumps({"op": "match", "request": 0, "hashes": [], "observe": {"refcounts": {"0x5": 1}}}), "decimal"),
    (json.dumps({"op": "match", "request": 0, "hashes": [], "observe": {"refcounts": {"\u00b2": 1}}}), "decimal"),
    (json.dumps({"op": "match", "request": 0, "hashes": [], "observe": {"refcounts": {str(1 << 64): 1}}}),
     "the refcounts' key 18446744073709551616 must be below 2\\*\\*64"),
    (json.dumps({"op": "match", "request": 0, "hashes": [], "observe": {"counters": [1]}}), "counters must map"),
    # a misspelt field is refused, not ignored with what it would have checked
    (json.dumps({"op": "match", "request": 0, "hashes": [], "obsreve": {"gpu_free": [0, 0]}}),
     "this match event has no field 'obsreve' .*start with _"),
    (json.dumps({"op": "match", "request": 0, "observe": {"gpu_fre": [0, 0]}}), "observe has no field 'gpu_fre'"),
    (json.dumps({"op": "allocate", "request": 0}), "this allocate event lacks blocks$"),
    (json.dumps({"op": "allocate", "request": 0, "blokcs": [2]}),  # misspelt: missing and unknown, both said
     r"this allocate event lacks blocks, and has no field 'blokcs' \(its fields: blocks, observe, op, request\)"),
    (json.dumps({"op": "release"}), "this release event lacks request"),
    (json.dumps({"op": "commit", "request": 0}), "this commit event lacks hashes"),
    (json.dumps({"op": "allocate", "request": 0, "blocks": [-1]}), "a block of blocks must be at least 0"),
    (json.dumps({"op": "match", "request": 0, "limit": -1}), "limit must be at least 0"),
    ('{"op": "release", "request": 0, "request": 1}', "field 'request' given twice"),
    (json.dumps({"request": 0}), r"the event has no op for a cache-level trace \(one of: allocate, commit"),
    (json.dumps({"op": "match", "request": 0, "hashes": [-7]}), "a hash of hashes must be at least 0"),
    (json.dumps({"op": "match", "request": 0, "hashes": [2 ** 64]}), "must be below 2\\*\\*64"),
    (json.dumps({"op": "evict", "steps": [["drop", -1]]}), "node must be at least 0"),
])
def test_malformed_lines_name_their_line(text: str, why: str) -> None:
    with pytest.raises(TraceFormatError, match=f"line 2: .*{why}"):
        check_trace([HEAD, text])


def test_an_engines_own_notes_are_fields_whose_names_start_with_an_underscore() -> None:
    head = json.dumps({**json.loads(HEAD), "_engine": "toy 1.0"})
    noted = [head, *(json.dumps({**json.loads(line), "_ts": 1.5}) for line in trace(GOOD)[1:])]
    assert check_trace(noted).passed
    with pytest.raises(TraceFormatError, match="line 1: a cache-level header has no field 'engine'"):
        check_trace([json.dumps({**json.loads(HEAD), "engine": "toy 1.0"}), *trace(GOOD)[1:]])


@pytest.mark.parametrize("header, says", [
    ({"format": "kvoracle-trace", "version": True, "gpu_blocks": 4, "cpu_blocks": 2}, "the header's version is true"),
    ({"format": "kvoracle-trace", "version": 3.0, "gpu_blocks": 4, "cpu_blocks": 2}, "the header's version is 3.0"),
    ({"format": "kvoracle-trace", "version": 4, "gpu_blocks": 4, "cpu_blocks": 2}, "the header.s version is 4: this kvoracle reads versions 1, 2 and 3"),
    ({"format": "kvtrace", "version": 3, "gpu_blocks": 4, "cpu_blocks": 2},
     'the header.s format must be "kvoracle-trace", not "kvtrace"'),
    ({"op": "match", "request": 0}, "this is an event: a trace starts with a header"),
])
def test_a_wrong_header_says_what_is_wrong(header: dict[str, object], says: str) -> None:
    with pytest.raises(TraceFormatError, match=f"line 1: {says}"):
        check_trace([json.dumps(header), *trace()[1:]])


def write(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_is_read_from_standard_input_and_past_a_byte_order_mark(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = "\n".join(trace(GOOD)) + "\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["check-trace", "-"]) == 0 and capsys.readouterr().out.startswith("<stdin>: ")
    assert main(["check-trace", str(write(tmp_path / "head.jsonl", [HEAD]))]) == 0
    assert "note: the trace has a header and no event: nothing was checked" in capsys.readouterr().out
    marked = tmp_path / "bom.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert main(["check-trace", str(marked)]) == 0


def test_a_long_prefix_shows_the_header_and_the_lines_before_the_violation(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    lines = trace()
    quiet = [json.dumps({"op": "match", "request": 9, "hashes": []}),
             json.dumps({"op": "release", "request": 9, "writes": []})] * 40
    bad = json.dumps({"op": "match", "request": 0, "hashes": [], "observe": {"gpu_free": [0, 0]}})
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join([lines[0], *quiet, bad]) + "\n")
    assert main(["check-trace", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    start = out.index("the shortest prefix that shows it (82 lines; the header and the last 30 shown):")
    assert out[start + 1].startswith("     1  {") and out[start + 2] == (
        "   ...  (lines 2 to 52: each replays without a violation)")
    assert out[start + 3].startswith("    53  ") and out[-1].startswith("    82  ") and len(out) == start + 33


def test_a_recording_makes_the_folder_it_is_written_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "new" / "folder" / "t.jsonl"
    assert main(["check", "--record", str(path), "--record-events", "5", "--record-only"]) == 0
    assert path.is_file() and ": a header and " in capsys.readouterr().out


def test_a_header_beyond_what_is_checked_is_refused_at_once() -> None:
    with pytest.raises(TraceFormatError, match="line 1: gpu_blocks is 100,000,000,000: .* at most 4,194,304"):
        check_trace([json.dumps({**json.loads(HEAD), "gpu_blocks": 10 ** 11}), *trace()[1:]])


def test_bytes_that_are_not_utf8_are_a_format_error_naming_their_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lines = trace(GOOD)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes("\n".join([*lines[:2], '{"op": "reset", "_note": "caf\u00e9"}']).encode("latin-1") + b"\n")
    assert main(["check-trace", str(bad)]) == 2
    assert "line 3: not UTF-8 text (byte 0xe9)" in capsys.readouterr().err


def test_a_trace_that_ends_mid_run_says_what_it_leaves_unjudged(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    running = tmp_path / "running.jsonl"
    running.write_text("\n".join(trace()[:3]) + "\n")  # r0 allocated its blocks, and the trace stops
    assert main(["check-trace", str(running)]) == 0
    assert "note: the trace ends with 1 request live (r0; 2 GPU blocks held): whether its blocks come back is " \
           "not judged" in capsys.readouterr().out
    done = tmp_path / "done.jsonl"
    done.write_text("\n".join(trace()) + "\n")
    assert main(["check-trace", str(done)]) == 0 and "note:" not in capsys.readouterr().out


def test_a_passing_trace_names_what_it_carries_nothing_for(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bare, seen = tmp_path / "bare.jsonl", tmp_path / "seen.jsonl"
    bare.write_text("\n".join(trace()) + "\n")
    seen.write_text("\n".join(trace(GOOD)) + "\n")
    assert main(["check-trace", str(bare)]) == 0
    out = capsys.readouterr().out
    assert "not checked: INV-CONSERVE, INV-NO-UAF, INV-TIER, INV-PIN and LIVE-EXIT: no event reports gpu_free or " \
           "cpu_free" in out and "not checked: INV-COUNTERS: no event reports counters" in out, out
    assert main(["check-trace", str(seen)]) == 0 and "not checked" not in capsys.readouterr().out
    assert check_trace(scheduler_trace()).unchecked[-2:] == (
        "LIVE-TRANSFER: no tick event (the trace's clock never moves)",
        "LIVE-ADMIT and LIVE-PROGRESS: no schedule and scheduled lines")


def test_a_violation_naming_a_hash_gives_it_in_decimal_as_the_trace_writes_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    busy = tmp_path / "busy.jsonl"  # r1 holds the prefix again, and eviction takes its leaf
    busy.write_text("\n".join(trace(extra=[{"op": "match", "request": 1, "hashes": [H1, H2]},
                                           {"op": "evict", "steps": [["drop", H2]]}])) + "\n")
    assert main(["check-trace", str(busy)]) == 1
    out = capsys.readouterr().out
    assert f"node {H2:#x} is not evictable on GPU: its refcount is 1" in out, out
    assert f"(the trace writes these hashes in decimal: {H2:#x} = {H2})" in out, out


def test_the_documented_block_hash_is_specs() -> None:
    """docs/trace.md's recipe for an engine outside Python, written from the page alone."""
    def documented(tokens: list[int], size: int) -> list[int]:
        out, parent = [], b"-"
        for start in range(0, len(tokens) - len(tokens) % size, size):
            block = tokens[start:start + size]
            if all(-2 ** 63 <= t < 2 ** 63 for t in block):
                body = b"q" + struct.pack(f"<{size}q", *block)
            else:
                body = b"t" + ",".join(map(str, block)).encode()
            digest = hashlib.blake2b(parent + body + b"x", digest_size=8).digest()
            out.append(int.from_bytes(digest, "little"))
            parent = digest
        return out

    for tokens, size in (([1, 1, 2, 2], 2), ([7] * 40, 16), ([5, 2 ** 70, 3], 1), ([0, -1, 9], 3)):
        assert documented(tokens, size) == list(block_hashes(tokens, size)), (tokens, size)
    page = (Path(__file__).resolve().parents[1] / "docs" / "trace.md").read_text()
    assert "BLAKE2b with an 8-byte digest" in page and "`spec.hashing.block_hashes([1, 1, 2, 2], 2)`" in page


def test_the_documented_example_prints_what_the_docs_show(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)  # the docs show the path relative to the repository
    assert main(["check-trace", "docs/examples/heap_drop.jsonl"]) == 1
    printed = capsys.readouterr().out.rstrip("\n")
    assert printed in (root / "docs" / "trace.md").read_text()


def scheduler_trace(version: int = 3, last: Sequence[dict[str, object]] = ()) -> list[str]:
    """A scheduler-level trace: r0's prompt is computed, cached, written to storage as r0
    finishes, and the write is answered; `last` replaces that answer."""
    head = {"format": "kvoracle-trace", "version": version, "level": "scheduler", "gpu_blocks": 4,
            "cpu_blocks": 0, "block_size": 2, "timeout": 2}
    events: list[dict[str, object]] = [
        {"op": "submit", "request": 0, "tokens": [1, 1, 2, 2]},
        {"op": "admit", "request": 0},
        {"op": "prefill", "request": 0, "tokens": 4, "blocks": [0, 1]},
        {"op": "insert", "request": 0, "blocks": 2},
        {"op": "exit", "request": 0, "to": "finished", "writes": [[H1, 0], [H2, 1]]},
        *(last or [{"op": "complete", "transfer": 0, "outcome": "ok"}]),
    ]
    return [json.dumps(head), *map(json.dumps, events)]


def test_a_scheduler_trace_whose_hashes_are_specs_passes() -> None:
    report = check_trace(scheduler_trace())
    assert report.passed and report.events == 6


def test_a_scheduler_trace_checks_its_own_clock() -> None:
    report = check_trace(scheduler_trace(last=[{"op": "tick", "ticks": 3}]))
    assert report.violations[0].id == "LIVE-TRANSFER" and report.line == 7
    # tick by tick (timeout 2): the second tick makes the write due, the third goes past it
    # without the engine's timeout: the third is the line that shows it
    report = check_trace(scheduler_trace(last=[{"op": "tick"}] * 3))
    assert report.violations[0].id == "LIVE-TRANSFER" and report.line == 9 and len(report.prefix) == 9
    in_time: list[dict[str, object]] = [{"op": "tick"}, {"op": "tick"},
                                        {"op": "complete", "transfer": 0, "outcome": "timeout"}, {"op": "tick"}]
    assert check_trace(scheduler_trace(last=in_time)).passed


def test_a_ticks_timeouts_follow_it_and_one_a_tick_late_is_caught() -> None:
    """The tick that brings a transfer to its timeout is a line of its own, its timeouts the
    lines after it (spec's step): judged before the next tick, not between them."""
    tick, timeout = {"op": "tick", "ticks": 2}, {"op": "complete", "transfer": 0, "outcome": "timeout"}
    assert check_trace(scheduler_trace(last=[tick, timeout])).passed
    late = check_trace(scheduler_trace(last=[tick, {"op": "tick", "ticks": 1}, timeout]))
    assert [v.id for v in late.violations] == ["LIVE-TRANSFER"] and late.line == 8  # the tick that went past it


def test_a_timeout_before_the_transfers_time_is_no_step_of_spec() -> None:
    """A transfer timed out one tick before its timeout (an engine whose clock runs ahead)."""
    early = check_trace(scheduler_trace(last=[{"op": "tick", "ticks": 1},
                                              {"op": "complete", "transfer": 0, "outcome": "timeout"}]))
    assert [v.id for v in early.violations] == ["PRECONDITION"], early.violations
    assert "timed out after 1 ticks in flight, before its timeout of 2" in early.violations[0].message


def test_a_version_2_scheduler_trace_is_refused_by_name() -> None:
    """Version 2 named a scheduler trace's blocks by spec's earlier hash encoding."""
    with pytest.raises(TraceFormatError, match="line 1: .*version 2 .*record it again"):
        check_trace(scheduler_trace(version=2))


# --- scheduling steps: LIVE-ADMIT and LIVE-PROGRESS ----------------------------------------------

SCHEDULER_HEAD = {"format": "kvoracle-trace", "version": 3, "level": "scheduler", "gpu_blocks": 4,
                  "cpu_blocks": 0, "block_size": 2, "timeout": 2}
PROMPT = [1, 1, 2, 2]
FIRST_STEP: list[dict[str, object]] = [
    {"op": "submit", "request": 0, "tokens": PROMPT},
    {"op": "schedule"}, {"op": "admit", "request": 0}, {"op": "prefill", "request": 0, "tokens": 4, "blocks": [0, 1]},
    {"op": "scheduled"},
]
# r0 (3 blocks with its next token, of 4) preempts itself and is admitted and refilled: it computes nothing new
SELF_PREEMPT: list[dict[str, object]] = [
    {"op": "schedule"}, {"op": "exit", "request": 0, "to": "preempted"}, {"op": "admit", "request": 0},
    {"op": "prefill", "request": 0, "tokens": 4, "blocks": [0, 1]}, {"op": "scheduled"},
]


def steps_trace(events: Sequence[dict[str, object]], **head: object) -> list[str]:
    return [json.dumps({**SCHEDULER_HEAD, **head}), *map(json.dumps, events)]


def test_scheduling_steps_that_decode_pass() -> None:
    decode: list[dict[str, object]] = [{"op": "schedule"}, {"op": "decode", "request": 0, "token": 7, "blocks": [2]},
                                       {"op": "scheduled"}]
    report = check_trace(steps_trace([*FIRST_STEP, *decode, {"op": "tick"}, *decode[:1], *decode[2:]]))
    assert report.passed  # one step that stands still is the grace
    stamped = [{**e, "_ts": 1.5} for e in [*FIRST_STEP, *decode]]  # an engine's own fields, on step lines too
    assert check_trace(steps_trace(stamped)).passed


def test_a_request_that_preempts_itself_for_ever_is_live_progress_at_the_second_step() -> None:
    report = check_trace(steps_trace([*FIRST_STEP, *SELF_PREEMPT, {"op": "tick"}, *SELF_PREEMPT, *SELF_PREEMPT]))
    assert [v.id for v in report.violations] == ["LIVE-PROGRESS"]
    assert report.line == 17 and "2 scheduling steps in a row" in report.violations[0].message
    # without the step lines the same events are checked without the property
    plain = [e for e in [*FIRST_STEP, *SELF_PREEMPT, *SELF_PREEMPT] if e["op"] not in ("schedule", "scheduled")]
    assert check_trace(steps_trace(plain)).passed


def test_an_event_between_steps_that_is_not_a_tick_or_a_submit_starts_the_count_again() -> None:
    second = {"op": "submit", "request": 1, "tokens": [2, 2]}
    between: list[dict[str, object]] = [second, {"op": "exit", "request": 1, "to": "aborted"}]
    assert check_trace(steps_trace([*FIRST_STEP, *SELF_PREEMPT, *between, *SELF_PREEMPT])).passed
    caught = check_trace(steps_trace([*FIRST_STEP, *SELF_PREEMPT, second, *SELF_PREEMPT]))
    assert [v.id for v in caught.violations] == ["LIVE-PROGRESS"]


def test_an_engine_that_leaves_a_request_that_fits_waiting_is_live_admit() -> None:
    idle: list[dict[str, object]] = [{"op": "schedule"}, {"op": "scheduled"}]
    report = check_trace(steps_trace([FIRST_STEP[0], *idle, {"op": "tick"}, *idle]))
    assert [v.id for v in report.violations] == ["LIVE-ADMIT"] and report.line == 7
    # with 2 of the 4 blocks reserved, r0 (3 blocks) does not fit: nothing is asked
    assert check_trace(steps_trace([FIRST_STEP[0], *idle, *idle], reserve=2)).passed


@pytest.mark.parametrize(("events", "head", "why"), [
    ([{"op": "scheduled"}], {}, "line 2: schedule opens a scheduling step and scheduled closes it"),
    ([{"op": "schedule"}, {"op": "schedule"}], {}, "line 3: schedule opens"),
    ([], {"reserve": 4}, "line 1: reserve must be below gpu_blocks"),
    ([], {"reserve": -1}, "line 1: reserve must be at least 0"),
    ([], {"block_size": 0}, "line 1: block_size must be at least 1"),
    ([], {"level": "Scheduler"}, "line 1: level must be"),
    ([{"op": "exit", "request": 0, "to": ["finished"]}], {}, "line 2: exit to"),
    ([{"op": "schedule", "observe": {"gpu_free": [0]}}], {},
     "line 2: a schedule line \\(it carries nothing but its op\\) has no field 'observe'"),
    ([{"op": "tick", "ticks": -1}], {}, "line 2: ticks must be at least 0"),
])
def test_misplaced_step_lines_and_a_bad_reserve_are_format_errors(events: list[dict[str, object]],
                                                                 head: dict[str, object], why: str) -> None:
    with pytest.raises(TraceFormatError, match=why):
        check_trace(steps_trace(events, **head))


def test_step_lines_belong_to_scheduler_traces_only() -> None:
    with pytest.raises(TraceFormatError, match=r'unknown op "schedule" for a cache-level trace \(one of: allocate'):
        check_trace([*trace(), json.dumps({"op": "schedule"})])


def test_every_trace_here_is_a_line_of_the_documented_schema() -> None:
    """docs/trace.md's JSON Schema admits the traces the reader reads (version 3 headers,
    both levels, step lines)."""
    jsonschema = pytest.importorskip("jsonschema")
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "trace.md").read_text()
    schema = json.loads(page.split("## JSON Schema", 1)[1].split("```json", 1)[1].split("```", 1)[0])
    recorded, scheduled = io.StringIO(), io.StringIO()
    record(recorded, steps=200, seed=0)
    record_scheduler(scheduled, steps=200, seed=0)
    traces = [read_lines(recorded.getvalue().splitlines()), read_lines(scheduled.getvalue().splitlines()),
              scheduler_trace(), trace(GOOD),
              steps_trace([*FIRST_STEP, *SELF_PREEMPT], reserve=1),
              read_lines((root / "docs" / "examples" / "heap_drop.jsonl").read_text().splitlines())]
    for lines in traces:
        for line in lines:
            jsonschema.validate(json.loads(line), schema)
    refused = [{**SCHEDULER_HEAD, "timeout": 0}, {**SCHEDULER_HEAD, "level": "Scheduler"}, {"op": "scheduled", "n": 1},
               {"op": "tick", "ticks": -1}, {"op": "match", "request": 0, "observe": {"refcounts": {"\u00b2": 1}}},
               {"op": "match", "request": 0, "obsreve": {}}, {"op": "match", "request": 0, "observe": {"gpu_fre": []}},
               {"op": "allocate", "request": 0}, {**SCHEDULER_HEAD, "reserv": 1},
               {"op": "allocate", "request": 0, "blocks": [-1]}, {"op": "match", "request": 0, "hashes": [-7]},
               {"op": "match", "request": 0, "hashes": [2 ** 64]}, {**SCHEDULER_HEAD, "version": True}]
    for bad in refused:  # lines the reader refuses, the schema too
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad), bad
    jsonschema.validate({"op": "reset", "_ts": 3}, schema)  # an engine's own note, as the reader takes it
    jsonschema.validate({"op": "schedule", "_ts": 3}, schema)
    jsonschema.validate({"op": "match", "request": 0, "limit": None}, schema)  # no limit, as the reader takes it
    assert check_trace([HEAD, json.dumps({"op": "match", "request": 0, "limit": None})]).passed


def recorded_scheduler(scheduler_class: type[ResourceManager], seed: int, steps: int = 400) -> list[str]:
    out = io.StringIO()
    assert record_scheduler(out, steps=steps, seed=seed, scheduler_class=scheduler_class) >= steps
    return read_lines(out.getvalue().splitlines())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_reference_schedulers_recorded_trace_passes(seed: int) -> None:
    lines = recorded_scheduler(ResourceManager, seed)
    ops = {json.loads(line).get("op") for line in lines[1:]}
    assert {"schedule", "scheduled", "submit", "admit", "prefill", "decode", "exit", "tick"} <= ops
    assert check_trace(lines).passed


@pytest.mark.parametrize(("scheduler_class", "expected"), [(SelfPreempt, "LIVE-PROGRESS"),
                                                           (StarvingAdmit, "LIVE-ADMIT")])
def test_a_scheduler_mutants_recorded_trace_fails_with_the_machines_id(
        scheduler_class: type[ResourceManager], expected: str) -> None:
    """The trace checker judges the same definition as the scheduler machine: the
    mutant that makes a request preempt itself for ever (bug class 14), and the one that
    leaves a request that needs every free block waiting (class 13), recorded as an engine
    would write them."""
    report = check_trace(recorded_scheduler(scheduler_class, 0, steps=1000))
    assert [v.id for v in report.violations] == [expected]
    assert json.loads(report.prefix[-1]) == {"op": "scheduled"}


@pytest.mark.parametrize(("mutant", "unseen"), [("double-free", True), ("self-preempt", False)])
def test_a_mutants_recorded_trace_that_shows_no_violation_says_so(
        mutant: str, unseen: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """double-free's bug shows only on a bad call, which no recorded workload makes: its
    trace passes, and recording it says so; self-preempt's trace shows its bug."""
    level = "scheduler" if mutant == "self-preempt" else "cache"
    assert main(["check", "--record", str(tmp_path / "t.jsonl"), "--record-level", level, "--mutant", mutant,
                 "--seeds", "1", "--examples", "5", "--no-coverage"]) == 0
    said = "note: this trace shows no violation" in capsys.readouterr().out
    assert said is unseen


def test_live_admits_count_starts_again_after_an_event_that_leaves_a_request_running() -> None:
    idle: list[dict[str, object]] = [{"op": "schedule"}, {"op": "scheduled"}]
    ran: list[dict[str, object]] = [{"op": "admit", "request": 0}, {"op": "prefill", "request": 0, "tokens": 4,
                                                                   "blocks": [0, 1]},
                                    {"op": "exit", "request": 0, "to": "preempted"}]
    assert check_trace(steps_trace([FIRST_STEP[0], *idle, *ran, *idle])).passed  # r0 ran between: a new count
    caught = check_trace(steps_trace([FIRST_STEP[0], *idle, {"op": "tick"}, *idle]))
    assert [v.id for v in caught.violations] == ["LIVE-ADMIT"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)


@functools.cache
def recorded_traces() -> tuple[tuple[str, ...], ...]:
    """Short traces of both levels, as the reference records them (observations included)."""
    traces = []
    for seed in (0, 1):
        cache = io.StringIO()
        record(cache, steps=40, seed=seed)
        traces += [tuple(cache.getvalue().splitlines()), tuple(recorded_scheduler(ResourceManager, seed, 40))]
    return tuple(traces)


def damaged(data: st.DataObject, line: str) -> str:
    """The JSON line with one value somewhere inside it (a field, an item, nested at any
    depth) replaced by any JSON value, or left as it was where it holds nothing."""
    whole = json.loads(line)
    node = whole
    while node:
        key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        if isinstance(node[key], dict | list) and node[key] and data.draw(st.booleans()):
            node = node[key]
            continue
        node[key] = data.draw(JSON_VALUES)
        break
    return json.dumps(whole)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(data=st.data())
def test_any_damage_to_a_recorded_trace_is_a_report_or_a_format_error(data: st.DataObject) -> None:
    """Whatever an engine writes, check-trace answers with a verdict or a format error
    naming a line, never a crash of its own (a list as an op once raised TypeError)."""
    lines = list(data.draw(st.sampled_from(recorded_traces())))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = damaged(data, lines[i])
    try:
        check_trace(lines)
    except TraceFormatError:
        pass
