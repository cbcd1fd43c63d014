"""jigsaw_env: cost tables, the SPB cost model, the cluster simulator and the Gymnasium env.

Importing the package registers ``JigsawCluster-v0`` (idempotently), so
``gymnasium.make("jigsaw_env:JigsawCluster-v0", **config)`` works. ``gymnasium.make`` wraps it in
``TimeLimit`` with ``max_episode_steps`` = :data:`MAX_EPISODE_STEPS` (env steps, not rounds)
unless given another (``max_episode_steps=-1``: no limit).
"""
from __future__ import annotations

from . import accel as _accel

_accel.install()  # the compiled build of the hot modules, when there is a current one (accel.py)

from gymnasium.envs.registration import register, registry  # noqa: E402

ENV_ID = "JigsawCluster-v0"
#: env steps (decisions and advances) after which ``gymnasium.make``'s TimeLimit truncates an
#: episode. A safety net only: an episode of the default settings ends by itself long before
#: (``python -m bench.episode_steps``: a random masked policy took at most 56,222 steps over 120
#: seeds, median 4,288; the jigsaw heuristic at most 9,328 over 20), and the env truncates by
#: itself a policy that runs nothing (``max_stalled_rounds``).
MAX_EPISODE_STEPS = 200_000

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="jigsaw_env.env:JigsawClusterEnv", max_episode_steps=MAX_EPISODE_STEPS)

__all__ = ["ENV_ID", "MAX_EPISODE_STEPS"]
