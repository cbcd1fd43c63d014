"""Up-front feedback for ``jigsaw simulate`` and ``jigsaw evaluate``: an overload warning and when
to show a progress bar.

A job table whose offered load (``traces.offered_load``: GPU-seconds asked for over the
GPU-seconds the cluster has while the jobs arrive) is far above 1 cannot be served: the queue
grows for as long as jobs arrive. :func:`overload_warning` says so on stderr before the replay
starts, with the growth rate in jobs per hour:

    arrivals per hour  = 3600 * jobs / arrival span (s)
    served per hour   <= arrivals per hour / offered load   (the cluster's GPU-seconds per hour
                                                              over the mean GPU-seconds of a job)
    queue growth/hour ~= arrivals per hour * (1 - 1 / offered load)

Both commands stay quiet (no warning, no bar) with ``--json`` when stdout is not a terminal.
"""
from __future__ import annotations

import math
import sys

#: offered loads at or above this get the warning
WARN_AT_LOAD = 2.0


def quiet(args) -> bool:
    """True when the command prints JSON to a pipe or file (``--json``, stdout not a terminal)."""
    return bool(getattr(args, "json", False)) and not sys.stdout.isatty()


def show_progress(args) -> bool:
    """``--progress``/``--no-progress`` when given; otherwise on when stderr is a terminal and
    the command is not :func:`quiet`."""
    given = getattr(args, "progress", None)
    if given is not None:
        return bool(given)
    return sys.stderr.isatty() and not quiet(args)


def queue_growth_per_hour(load: float, n_jobs: int, span_s: float) -> float:
    """Jobs per hour by which the waiting queue grows at offered ``load`` when ``n_jobs`` arrive
    over ``span_s`` seconds (0 at load <= 1; module docstring)."""
    if not (span_s > 0 and math.isfinite(load)) or load <= 1.0:
        return 0.0
    return 3600.0 * n_jobs / span_s * (1.0 - 1.0 / load)


def overload_warning(load: float, gpus: int, n_jobs: int, span_s: float, label: str = "") -> str | None:
    """The one-line warning for an offered ``load`` >= WARN_AT_LOAD on ``gpus`` GPUs, or None."""
    if not (math.isfinite(load) and load >= WARN_AT_LOAD and span_s > 0):
        return None
    arrivals = 3600.0 * n_jobs / span_s
    grow = queue_growth_per_hour(load, n_jobs, span_s)
    where = f" ({label})" if label else ""
    return (f"warning: offered load {load:.3g} on {gpus} GPUs{where}: the queue grows by about {grow:.3g} jobs "
            f"per hour ({arrivals:.3g} arrive per hour, the cluster finishes at most {arrivals / load:.3g}); "
            f"expect most jobs to wait (use --load or more --gpus for a load near 1)")


def warn(line: str | None, args) -> None:
    """Print ``line`` on stderr unless it is None or the command is :func:`quiet`."""
    if line and not quiet(args):
        print(line, file=sys.stderr, flush=True)
