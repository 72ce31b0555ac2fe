"""Header names that describe one connection's framing, not the message (RFC 9110 §7.6.1 and kin).

Resending, exporting or replaying a captured message must drop them: the new connection frames
the bytes itself.
"""

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
)
