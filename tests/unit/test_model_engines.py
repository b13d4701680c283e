"""ModelEngines (server/model_engines.py) with stand-in engines: each context's commands go to its model's engine,
and a failure says which model it comes from."""
from __future__ import annotations

from talkgate.server.model_engines import ModelEngines
from talkgate.synth.api import AppendText, ContextFailed, ContextParams, OpenContext, VoiceFailed
from tests.compat_harness import INFO


class StandInEngine:
    """What ModelEngines uses of an engine: the commands it was given, events handed to its client on demand."""

    max_behind = 8
    info = INFO
    ready = True

    def __init__(self):
        self.submitted: list = []
        self.deliver = None

    def connect(self, deliver) -> int:
        self.deliver = deliver
        return 7

    def submit(self, client: int, commands: list) -> None:
        self.submitted += commands


def test_commands_follow_their_context_to_its_models_engine_and_failures_name_the_model():
    cv, base = StandInEngine(), StandInEngine()
    engines = ModelEngines({"cv": cv, "base": base})
    delivered: list = []
    client = engines.connect(delivered.extend)
    engines.submit(client, [OpenContext(1, ContextParams()), OpenContext(2, ContextParams(), "base"),
                            AppendText(2, (5,)), AppendText(1, (6,))])
    assert [(type(c).__name__, c.context) for c in cv.submitted] == [("OpenContext", 1), ("AppendText", 1)]
    assert [(type(c).__name__, c.context) for c in base.submitted] == [("OpenContext", 2), ("AppendText", 2)]
    base.deliver([ContextFailed(2, "engine_full", "all engine slots are busy"), VoiceFailed(3, "engine_full", "x")])
    assert [e.message for e in delivered] == ["model base: all engine slots are busy", "model base: x"]
    assert delivered[0].code == "engine_full"


def test_one_model_delivers_its_engines_events_as_they_are():
    engine = StandInEngine()
    engines = ModelEngines({"cv": engine})
    delivered: list = []
    engines.connect(delivered.extend)
    engine.deliver([ContextFailed(1, "engine_full", "all engine slots are busy")])
    assert delivered == [ContextFailed(1, "engine_full", "all engine slots are busy")]
