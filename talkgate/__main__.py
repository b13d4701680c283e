"""`python -m talkgate`: the `talkgate` command (cli/main.py)."""
import sys

from talkgate.cli.main import main

sys.exit(main())
