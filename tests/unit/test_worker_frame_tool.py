"""bench/worker_frame.py times what it says: every frame it feeds goes out as audio of the opened stream."""
import numpy as np
import pytest

from bench.worker_frame import frames_through, open_stream, speech


@pytest.mark.parametrize("encoding, rate", [("opus", 48000), ("pcm_s16le", 24000)])
def test_every_frame_fed_is_sent_as_audio(tokenizer, encoding, rate):
    proto, context = open_stream(tokenizer, encoding, rate)
    times = frames_through(proto, context, speech(1000), 20)
    assert len(times) == 20 and all(t > 0 for t in times)


def test_frames_that_send_no_audio_are_caught(tokenizer):
    proto, context = open_stream(tokenizer, "opus", 48000)
    with pytest.raises(RuntimeError, match="sent no audio"):       # empty PCM: nothing to encode, nothing timed
        frames_through(proto, context, np.zeros(0, np.float32), 3)
