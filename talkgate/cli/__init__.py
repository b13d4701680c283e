"""The `talkgate` command: its parser and one module per subcommand."""
