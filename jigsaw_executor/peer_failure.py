"""Errors a worker gets *because* a peer died or stalled (a reset connection, a broken pipe, a
collective that timed out): they are never the root cause of a job's failure. The launcher, the
live executor's recovery and a worker's control loop all tell them apart with
:func:`is_peer_failure`."""
from __future__ import annotations

__all__ = ["PEER_FAILURE_PATTERNS", "is_peer_failure"]

#: lower-case fragments of a peer's failure as seen by the surviving rank
PEER_FAILURE_PATTERNS = ("connection reset by peer", "connection closed by peer", "broken pipe", "timed out",
                         "timeout", "socket closed", "connection refused", "epipe", "read error", "write error")


def is_peer_failure(rec: dict) -> bool:
    """Whether an error record (its ``type`` and ``message``) reads as a peer's failure."""
    text = f"{rec.get('type', '')} {rec.get('message', '')}".lower()
    return any(p in text for p in PEER_FAILURE_PATTERNS)
