"""The one error type of talkgate.codecs: a format the caller asked for that cannot be produced."""


class FormatError(ValueError):
    """Unknown encoding, a rate or option the encoding does not take, or a codec missing on this machine.

    The message is meant for the client as is: it names what was asked and what is valid.
    """
