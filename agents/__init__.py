"""Schedulers acting on the simulator state (heuristics) and helpers for learned agents.

Registered names (``jigsaw simulate --agent NAME``): fifo, srtf, tiresias, gandiva, jigsaw, jigsaw-srtf,
their spilling forms jigsaw-spill and jigsaw-srtf-spill, random, and the SPB-level variants fifo+spb,
srtf+spb, tiresias+spb, gandiva+spb.
docs/schedulers.md describes each one. A scheduler outside this package is used by its import path
(``mypkg.mod:ClassName``) or by the name of an installed ``jigsaw.schedulers`` entry point.
"""
from .base import Scheduler, available_schedulers, is_scheduler, make_scheduler, register_scheduler
from . import fifo  # noqa: F401  (registers "fifo")
from . import srtf  # noqa: F401
from . import tiresias  # noqa: F401
from . import gandiva  # noqa: F401
from . import jigsaw  # noqa: F401
from . import rand  # noqa: F401  ("random")
from . import spb_wrapper  # noqa: F401  ("fifo+spb", "srtf+spb", "tiresias+spb", "gandiva+spb")

__all__ = ["Scheduler", "available_schedulers", "is_scheduler", "make_scheduler", "register_scheduler"]
