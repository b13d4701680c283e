"""Audio output formats: pure, per-stream, no asyncio and no torch (numpy, soxr, libopus, libsndfile).

Importing this package loads no codec library that may be missing: libopus is loaded on the first
Opus stream, so a server without it still serves PCM.
"""
from talkgate.codecs.encoder import ENCODINGS, Packet, StreamEncoder, make_stream_encoder
from talkgate.codecs.formaterror import FormatError
from talkgate.codecs.opus import OpusUnavailable

__all__ = ["ENCODINGS", "FormatError", "OpusUnavailable", "Packet", "StreamEncoder", "make_stream_encoder"]
