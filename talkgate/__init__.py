"""talkgate: a real-time voice-agent gateway for streaming Qwen3-TTS."""

__version__ = "0.1.0"
