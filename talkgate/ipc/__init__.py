"""Engines and gateway workers in separate processes: the messages between them (wire.py), their transport
(channel.py), the engine's side (engine_server.py) and the workers' view of the engines (remote_engines.py)."""
