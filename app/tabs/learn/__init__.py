"""The Learn tab: the lessons drawn from recorded traces, and the rejection-sampling explainer."""
