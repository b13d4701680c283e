"""The processes of `talkgate serve`: the supervisor, a gateway worker, an engine process, the single-process server."""
