"""The JSON-lines appender the usage log, the audit log and --trace-latency share (server/jsonlines.py): whole lines,
a line cut short never glued to the next record, the sync rule, the byte budget; the usage reader skips what does
not parse."""
from __future__ import annotations

import asyncio
import json
import os

from talkgate.server.jsonlines import JsonLines
from talkgate.server.usage import UsageLog, totals


def test_a_line_cut_short_at_the_end_is_ended_before_the_next_record(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a":1}\n{"cut sh')
    log = JsonLines(path, "test log")
    assert log.write({"b": 2}) and log.write({"c": 3})
    log.close()
    assert path.read_bytes() == b'{"a":1}\n{"cut sh\n{"b":2}\n{"c":3}\n'
    log = JsonLines(path, "test log")          # a whole last line: nothing added
    log.write({"d": 4})
    log.close()
    assert path.read_bytes().endswith(b'{"c":3}\n{"d":4}\n')


def test_usage_totals_skip_a_cut_line_and_count_every_whole_one(tmp_path):
    path = tmp_path / "usage.jsonl"
    record = {"key_id": "k", "tenant": "t", "model": "m", "api": "native", "characters": 5, "audio_s": 0.24,
              "start": 1.0, "end": 2.0}
    path.write_bytes(json.dumps({"id": "1", **record}).encode() + b'\n{"id":"2","key_id":"k","ten')
    usage = UsageLog(path)
    usage.record({"id": "3", **record})
    usage.close()
    body = totals(path, None, None)
    assert (body["records"], body["skipped"]) == (2, 1), body
    assert body["totals"] == [{"key_id": "k", "tenant": "t", "model": "m", "contexts": 2, "characters": 10,
                               "audio_s": 0.48}]


def test_records_are_synced_within_sync_s_of_their_write(tmp_path):
    async def go():
        log = JsonLines(tmp_path / "log.jsonl", "test log", sync_s=0.2)
        log.write({"a": 1})                 # the file was opened just now: its sync waits for the period
        assert log.sync_later is not None
        synced = log.synced
        await asyncio.sleep(0.3)
        assert log.sync_later is None and log.synced > synced
        log.write({"b": 2})                 # not yet sync_s since the last: later again
        assert log.sync_later is not None
        log.close()
        assert log.sync_later is None and log.fd is None
    asyncio.run(go())
    unsynced = JsonLines(tmp_path / "other.jsonl", "test log")
    unsynced.write({"a": 1})
    assert unsynced.sync_later is None     # sync_s None: never
    unsynced.close()


def test_a_process_stops_at_its_byte_budget_and_on_a_failing_write_when_told(tmp_path):
    log = JsonLines(tmp_path / "trace.jsonl", "trace", max_bytes=20, stop_on_error=True)
    assert log.write({"a": "x" * 5}) and not log.write({"b": "y" * 10}) and log.fd is None
    assert (tmp_path / "trace.jsonl").read_bytes() == b'{"a":"xxxxx"}\n'
    log = JsonLines(tmp_path / "t2.jsonl", "trace", stop_on_error=True)
    os.close(log.fd)
    log.fd = os.open(os.devnull, os.O_RDONLY)      # a write that fails (EBADF): the file stops
    assert not log.write({"a": 1}) and log.fd is None
    log = JsonLines(tmp_path / "t3.jsonl", "usage log")
    os.close(log.fd)
    log.fd = os.open(os.devnull, os.O_RDONLY)
    assert not log.write({"a": 1}) and log.fd is not None       # logged, the next record tried
    log.close()
