"""Bytes counted at the transport: the loopback interface's byte counters (Linux ``/proc/net/dev``).

The executor's ``bytes_sent`` and ``bytes_on_wire_total`` are counted at its collective calls with
the simulator's own formulas (``ring_bytes_sent``, eq. N3): what the algorithm must send, not what
went over a wire. On one machine gloo sends over the loopback interface ``lo``, whose kernel
counters count every byte that actually went through it. :func:`loopback_bytes` reads them and
:class:`LoopbackWindow` takes the difference around a piece of code.

What such a difference holds (docs/executor.md, "Bytes at the transport"):

* every byte sent over loopback by *every* process of the machine during the window: the job's
  collectives, and also its store traffic, Ray's and any other process's (on a shared machine the
  count is an upper bound of the job's own traffic, never a lower one);
* TCP/IP framing: each packet carries its headers (about 52-66 bytes per segment of up to 64 KiB
  on loopback), so a collective of M payload bytes shows up as slightly more than M;
* on loopback every byte is counted once in ``lo``'s transmit and once in its receive counter;
  :func:`loopback_bytes` returns the transmit count (the two are equal on ``lo``).

It is not available off Linux (no ``/proc/net/dev``) or in a network namespace without ``lo``:
:func:`loopback_bytes` then raises :class:`TransportCounterUnavailable` (one line, naming the file
and the interface) and :class:`LoopbackWindow` with ``required=False`` reports None.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["PROC_NET_DEV", "TransportCounterUnavailable", "parse_net_dev", "loopback_bytes", "LoopbackWindow"]

PROC_NET_DEV = "/proc/net/dev"


class TransportCounterUnavailable(RuntimeError):
    """The interface's byte counters cannot be read (no such file, or no such interface)."""


def parse_net_dev(text: str, where: str = PROC_NET_DEV) -> dict[str, tuple[int, int]]:
    """Interface -> (received bytes, transmitted bytes) from the text of ``/proc/net/dev`` (two
    header lines, then ``name: rx_bytes rx_packets ... (8 receive fields) tx_bytes ...``).
    ValueError naming ``where`` and the line for a line that is not of that form."""
    out: dict[str, tuple[int, int]] = {}
    for n, line in enumerate(text.splitlines()[2:], start=3):
        if not line.strip():
            continue
        name, sep, fields = line.partition(":")
        cols = fields.split()
        if not sep or len(cols) < 9 or not all(c.isdigit() for c in cols[:9]):
            raise ValueError(f"{where}: line {n}: expected 'interface: rx_bytes ... (8 receive fields) tx_bytes ...', "
                             f"got {line.strip()!r}")
        out[name.strip()] = (int(cols[0]), int(cols[8]))
    return out


def loopback_bytes(iface: str = "lo", path: str | Path = PROC_NET_DEV) -> int:
    """Bytes transmitted over ``iface`` since boot (the kernel's counter). Raises
    :class:`TransportCounterUnavailable` when ``path`` or the interface is missing."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TransportCounterUnavailable(f"{p}: cannot read the interface byte counters ({e.strerror or e}); "
                                          f"bytes at the transport are counted on Linux only") from None
    counters = parse_net_dev(text, str(p))
    if iface not in counters:
        raise TransportCounterUnavailable(f"{p}: no interface {iface!r} (interfaces: {sorted(counters)})")
    return counters[iface][1]


class LoopbackWindow:
    """``with LoopbackWindow() as w: ...`` then ``w.bytes``: the bytes transmitted over ``iface``
    while the block ran (every process of the machine; module docstring). With ``required=False``
    an unreadable counter gives ``w.bytes = None`` instead of raising."""

    def __init__(self, iface: str = "lo", path: str | Path = PROC_NET_DEV, required: bool = True):
        self.iface, self.path, self.required = iface, path, required
        self.start: int | None = None
        self.bytes: int | None = None

    def _read(self) -> int | None:
        try:
            return loopback_bytes(self.iface, self.path)
        except TransportCounterUnavailable:
            if self.required:
                raise
            return None

    def __enter__(self) -> "LoopbackWindow":
        self.start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        end = self._read() if self.start is not None else None
        self.bytes = None if end is None or self.start is None else end - self.start
