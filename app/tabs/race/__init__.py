"""The Race tab: the same prompt through the baseline and up to three methods, timed in one slot."""
