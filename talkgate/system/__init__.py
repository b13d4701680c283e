"""What a talkgate process does with its operating system, below every layer: die with its parent, room for its descriptors, its threads' CPU wait, its garbage collector, a warm-up watchdog."""
