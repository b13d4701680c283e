"""The served models' engines seen as one engine (synth.api.EngineInterface), each context on the engine of the
model its OpenContext names (sessions/models.py chose it; None: the default, the first model).

    engines = ModelEngines({"cv": RemoteEngines([...]), "base": RemoteEngines([...])})   # or in-process Engines
    client = engines.connect(deliver)       # one client: the process's EngineClient
    engines.submit(client, [OpenContext(1, params, "base"), AppendText(1, ids), EndText(1)])

Each model's engine sees the one client under the same context ids (unique in the EngineClient), so events come
back as they went, whichever engine made them. Commands after an OpenContext (or MakeVoice) follow it to its
engine by its id until the context's last event (ContextDone, ContextFailed; VoiceMade, VoiceFailed) or its
CancelContext. A command that names no model goes to the default's engine (sessions/models.py chose every model: an
upload's MakeVoice names the Base model that makes it, voices_http.py).

Faults stay within a model: each model's engines fail only their own contexts (ipc/remote_engines.py), their
failures' messages name the model, and `ready` is the default model's (plain /ready); `model_ready(name)` answers /ready?model=NAME.
With one model every command goes to its engine as it came and nothing is tracked: a server of one model
behaves as before there were several.
"""
from __future__ import annotations

import threading
from dataclasses import replace

from talkgate.sessions.models import Model, Models, model_name
from talkgate.synth.api import (
    CancelContext, ContextDone, ContextFailed, EngineCommand, MakeVoice, OpenContext, VoiceFailed, VoiceMade,
    event_key,
)

CLIENT = 1                  # the id of the one client
LAST_EVENTS = (ContextDone, ContextFailed, VoiceMade, VoiceFailed)


def naming_model(ev, name: str):
    """A failure (engine_full, engine_failed, ...) names the model whose engines it comes from: with several models
    `all engine slots are busy` alone does not say which model to add capacity to, nor which engine died."""
    if isinstance(ev, (ContextFailed, VoiceFailed)):
        return replace(ev, message=f"model {name}: {ev.message}")
    return ev


class ModelEngines:
    def __init__(self, engines: dict, aliases: dict[str, str] | None = None):
        """`engines`: model name -> its engine (an in-process Engine or a worker's RemoteEngines), the default first;
        `aliases`: alias -> model name (sessions/models.py Models)."""
        self.engines = dict(engines)
        self.aliases = dict(aliases or {})
        self.names = list(self.engines)
        self.default = self.engines[self.names[0]]
        self.max_behind = min(e.max_behind for e in self.engines.values())
        self._clients: dict[str, int] = {}
        self._routes: dict[int, str] = {}          # context or voice request -> its model (several models only)
        self._lock = threading.Lock()              # deliver may run on an in-process engine's thread

    @classmethod
    def of(cls, engine) -> "ModelEngines":
        """One engine as the one model it runs (named by its checkpoint, as `talkgate serve --model DIR` names it)."""
        return engine if isinstance(engine, cls) else cls({model_name(engine.info.name): engine})

    # ----- what the gateway reads -----
    @property
    def info(self):
        return self.default.info

    def models(self) -> Models:
        """The served models (their infos: known once each model's engine greeted)."""
        return Models([Model(name, engine.info) for name, engine in self.engines.items()], self.aliases)

    def new_tokenizer(self):
        return self.default.new_tokenizer()

    @property
    def ready(self) -> bool:
        return self.default.ready

    def model_ready(self, name: str) -> bool:
        return self.engines[name].ready

    def model_stats(self, name: str) -> dict:
        return self.engines[name].stats()

    def stats(self) -> dict:
        """One model: its engine's stats. Several: the slots and contexts summed, each engine process's stats
        with its model (RemoteEngines' "engines"), and each model's stats under "models"."""
        if len(self.engines) == 1:
            return self.default.stats()
        per_model = {name: engine.stats() for name, engine in self.engines.items()}
        total: dict = {"models": per_model, "engines": []}
        for name, stats in per_model.items():
            for key in ("free_slots", "slots", "contexts", "running", "waiting", "frames"):
                if key in stats:
                    total[key] = total.get(key, 0) + stats[key]
            total["engines"] += [{**e, "model": name} for e in stats.get("engines", ())]
        return total

    # ----- the hooks the worker and the EngineClient set: on every model's engine -----
    @property
    def hold(self):
        return self.default.hold

    @hold.setter
    def hold(self, hold) -> None:
        for engine in self.engines.values():
            engine.hold = hold

    # ----- the client -----
    def connect(self, deliver) -> int:
        if len(self.engines) == 1:
            self._clients[self.names[0]] = self.default.connect(deliver)
            return CLIENT
        for name, engine in self.engines.items():
            self._clients[name] = engine.connect(self._delivery(name, deliver))
        return CLIENT

    def _delivery(self, name: str, deliver):
        def on_events(events: list) -> None:
            with self._lock:
                for ev in events:
                    if isinstance(ev, LAST_EVENTS):
                        self._routes.pop(event_key(ev), None)
            deliver([naming_model(ev, name) for ev in events])
        return on_events

    def disconnect(self, client: int) -> None:
        with self._lock:
            self._routes.clear()
        for name, engine in self.engines.items():
            engine.disconnect(self._clients[name])

    def submit(self, client: int, commands: list[EngineCommand]) -> None:
        """Each command to its model's engine, in order (a run of commands for one engine goes as one submit)."""
        if len(self.engines) == 1:
            self.default.submit(self._clients[self.names[0]], commands)
            return
        runs: list[tuple[str, list]] = []
        with self._lock:
            for cmd in commands:
                name = self._model_of(cmd)
                if name is None:
                    continue                        # its context is over: nothing to send it to
                if runs and runs[-1][0] == name:
                    runs[-1][1].append(cmd)
                else:
                    runs.append((name, [cmd]))
        for name, run in runs:
            self.engines[name].submit(self._clients[name], run)

    def send_now(self) -> None:
        for engine in self.engines.values():
            engine.send_now()

    def _model_of(self, cmd: EngineCommand) -> str | None:
        if isinstance(cmd, OpenContext):
            name = self._routes[cmd.context] = self._named(cmd.model)
            return name
        if isinstance(cmd, MakeVoice):
            name = self._routes[cmd.request] = self._named(cmd.model)
            return name
        if isinstance(cmd, CancelContext):
            return self._routes.pop(cmd.context, None)
        return self._routes.get(cmd.context)

    def _named(self, model: str | None) -> str:
        return self.names[0] if model is None else model
