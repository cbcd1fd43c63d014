"""``random``: a masked random policy, usable as a scheduler (a floor for every comparison)."""
from __future__ import annotations

import numpy as np

from jigsaw_env.actions import ActionCodec, RoundBuilder
from jigsaw_env.state import ClusterState, Decision

from .base import Scheduler, register_scheduler


@register_scheduler("random")
class RandomMasked(Scheduler):
    """Each round, build the decision the way the environment's agent does: starting from the
    allocation in force, draw uniformly among the feasible actions (exact masks of
    :class:`~jigsaw_env.actions.RoundBuilder`: run a window job with a placement option and SPB
    level/pattern, pause a running job, or advance) until "advance" is drawn or ``2K + 2`` actions
    were taken (the env's own limit). Seeded with a numpy Generator; :meth:`reset` restarts it.
    """

    def __init__(self, seed: int = 0, window_k: int = 16):
        self.seed = int(seed)
        self.window_k = int(window_k)
        self.reset()

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self._codec: ActionCodec | None = None

    def _state(self) -> dict:
        # numpy's bit generator state is a dict of ints and a name (plain data); the codec is a cache
        return {"rng": self.rng.bit_generator.state}

    def _load_state(self, d: dict) -> None:
        rng = d.get("rng")
        if not isinstance(rng, dict) or rng.get("bit_generator") != type(self.rng.bit_generator).__name__:
            raise ValueError(f"scheduler state: field 'rng': expected a {type(self.rng.bit_generator).__name__} "
                             f"bit generator state")
        try:
            self.rng.bit_generator.state = rng
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"scheduler state: field 'rng': not a bit generator state ({e})") from None

    def schedule(self, state: ClusterState) -> Decision:
        if self._codec is None or self._codec.spb != state.spb:
            # the menu without host slots: the random baseline's draws are those of its golden metrics
            self._codec = ActionCodec(self.window_k, state.spb, host_slots=0)
        builder = RoundBuilder(state, self._codec)
        for _ in range(2 * self.window_k + 2):
            allowed = np.flatnonzero(builder.masks())
            a = int(self.rng.choice(allowed))
            if a == self._codec.advance:
                break
            builder.apply(a)
        return builder.ledger.decision
