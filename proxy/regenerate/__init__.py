"""Regenerating an unrecoverable tool call (issue 19): the pure rules a new attempt is built by.

`eligibility` says whether to ask the upstream again now (and admits the attempt against the
upstream's budget), `continuation` builds the next attempt's request body from what the client
already has, and `echo` strips the prefix an engine repeats in the attempt's response. None of them
does I/O: the wiring feeds them the stage's outcome, the clock and the bytes.
"""
