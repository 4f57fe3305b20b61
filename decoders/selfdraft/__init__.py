"""Learned self-drafters that draft from inside the target (issue 26).

early exit (Kangaroo / LayerSkip style): the target's first k layers + one trained block + the target's final norm
and LM head; the first k layers' KV and hidden states of drafted tokens are reused by verification.
prophet: a small decoder whose first input is the target's projected last hidden state; it drafts on its own.

stem.py runs any slice of the target's layers on its cache; heads.py holds the two modules; train.py the losses and
held-out acceptance on the shared loop (decoders/training); store.py the one save/load format; __main__.py the CLI.
"""
