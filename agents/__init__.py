"""Schedulers acting on the simulator state (heuristics) and helpers for learned agents."""
from .base import Scheduler, available_schedulers, make_scheduler, register_scheduler
from . import fifo  # noqa: F401  (registers "fifo")

__all__ = ["Scheduler", "available_schedulers", "make_scheduler", "register_scheduler"]
