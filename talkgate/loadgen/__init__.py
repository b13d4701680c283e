"""The load generator behind `talkgate bench`: real clients over real sockets, measured as a player would hear them."""
