"""The keys file (server/keys.py): its format, hashed keys, reload keeping the keys in force on a bad file; the
audit log's records and bounds (server/audit.py)."""
from __future__ import annotations

import hashlib
import json
import logging
import os

import pytest

from talkgate.server.audit import MAX_LINE_BYTES, REFUSED_PER_MINUTE, AuditLog
from talkgate.server.keys import DEFAULT_TENANT, Keyring, KeysError, KeysFile, parse


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def line(id: str, tenant: str, secret: str, role: str = "user", **extra) -> str:
    return json.dumps({"id": id, "tenant": tenant, "role": role, "sha256": sha(secret), **extra})


GOOD = "\n".join(["# two tenants", line("a-1", "acme", "sa1"), "", line("b-1", "beta", "sb1", "admin",
                                                                         limits={"connections": 3})])


def test_keys_identify_by_the_secrets_hash():
    ring = parse(GOOD, "keys.jsonl")
    a, b = ring.identify("sa1"), ring.identify("sb1")
    assert (a.key_id, a.tenant, a.role, a.admin) == ("a-1", "acme", "user", False)
    assert (b.key_id, b.tenant, b.admin, b.limits) == ("b-1", "beta", True, {"connections": 3})
    for wrong in ("sa", "sa1 ", sha("sa1"), "", None, "\udcff"):      # the hash itself is not a key
        assert ring.identify(wrong) is None
    shortcut = Keyring.from_secrets(("k1", "k2"))
    assert [(i.key_id, i.tenant, i.role) for i in (shortcut.identify("k1"), shortcut.identify("k2"))] == [
        ("api-key-1", DEFAULT_TENANT, "admin"), ("api-key-2", DEFAULT_TENANT, "admin")]


@pytest.mark.parametrize("bad, why", [
    ("{not json", "not JSON"),
    ("[1]", "a key is a JSON object"),
    (json.dumps({"id": "x", "tenant": "t", "sha256": sha("s"), "secret": "s"}), "unknown field 'secret'"),
    (json.dumps({"id": "x y", "tenant": "t", "sha256": sha("s")}), "id must be"),
    (json.dumps({"id": "x", "tenant": "", "sha256": sha("s")}), "tenant must be"),
    (json.dumps({"id": "x", "tenant": "t\nu", "sha256": sha("s")}), "tenant must be"),
    (json.dumps({"id": "x", "tenant": "t", "role": "root", "sha256": sha("s")}), "role must be admin or user"),
    (json.dumps({"id": "x", "tenant": "t", "sha256": sha("s").upper()}), "sha256 must be"),
    (json.dumps({"id": "x", "tenant": "t", "sha256": "s"}), "sha256 must be"),
    (json.dumps({"id": "x", "tenant": "t", "sha256": sha("s"), "limits": {"connectionz": 1}}), "unknown limit"),
    (json.dumps({"id": "x", "tenant": "t", "sha256": sha("s"), "limits": {"connections": 0}}), "positive integer"),
    (json.dumps({"id": "x", "tenant": "t", "sha256": sha("s"), "limits": {"contexts": True}}), "positive integer"),
    (line("a-1", "other", "s2"), "the id 'a-1' is used twice"),
    (line("a-2", "other", "sa1"), "the same sha256 is given twice"),
])
def test_a_bad_line_is_named_with_why(bad, why):
    with pytest.raises(KeysError) as e:
        parse(GOOD + "\n" + bad + "\n" + line("z", "t", "sz"), "keys.jsonl")
    assert e.value.line == 5 and why in e.value.why and str(e.value).startswith("keys file keys.jsonl line 5: ")


def test_reload_keeps_the_keys_in_force_on_a_bad_file(tmp_path, caplog):
    path = tmp_path / "keys.jsonl"
    path.write_text(GOOD)
    keys = KeysFile(path)
    assert not keys.changed() and keys.keyring.identify("sa1").tenant == "acme"
    path.write_text(line("c-1", "gamma", "sc1") + "\n" + line("c-1", "gamma", "sc2"))
    os.utime(path, ns=(1, 1))           # a change within the clock's tick is seen too (size, inode, mtime)
    assert keys.changed()
    with caplog.at_level(logging.ERROR, "talkgate.keys"):
        error = keys.reload()
    assert error.line == 2 and "line 2: the id 'c-1' is used twice; the 2 key(s) in force stay" in caplog.text
    assert keys.keyring.identify("sa1") is not None and keys.keyring.identify("sc1") is None
    assert not keys.changed()           # logged once, not again at every poll
    path.write_text(line("c-1", "gamma", "sc1"))
    assert keys.changed() and keys.reload() is None
    assert keys.keyring.identify("sa1") is None and keys.keyring.identify("sc1").tenant == "gamma"
    path.unlink()
    assert keys.changed() and keys.reload() is not None and keys.keyring.identify("sc1") is not None
    with pytest.raises(KeysError, match="line 1: not JSON"):      # at start: no keys to keep, start-up fails
        path.write_text("nope")
        KeysFile(path)


def test_audit_records_are_whole_lines_bounded_and_refusals_rate_limited(tmp_path):
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    audit.record("voice_created", voice="voice_0000000000000001", consent="c" * 10_000, tenant="acme")
    audit.record("voice_deleted", labels={str(i): "x" * 300 for i in range(100)})
    for _ in range(REFUSED_PER_MINUTE + 5):
        audit.key_refused("unknown_key", path="/v1/ws")
    audit.record("keys_reloaded", keys=2)
    audit.close()
    lines = path.read_bytes().splitlines()
    records = [json.loads(x) for x in lines]
    assert all(len(x) < MAX_LINE_BYTES for x in lines)
    assert records[0]["event"] == "voice_created" and len(records[0]["consent"]) == 256
    assert records[1] == {**{k: records[1][k] for k in ("time", "pid")}, "event": "voice_deleted", "truncated": True}
    assert sum(r["event"] == "key_refused" for r in records) == REFUSED_PER_MINUTE
    assert records[-1]["event"] == "keys_reloaded" and records[-1]["refused_left_out"] == 5
    assert AuditLog(None).record("anything") is None     # without --audit-log nothing is written
