"""jigsaw_env: cost tables, the SPB cost model, the cluster simulator and the Gymnasium env.

Importing the package registers ``JigsawCluster-v0`` (idempotently), so
``gymnasium.make("jigsaw_env:JigsawCluster-v0", **config)`` works.
"""
from __future__ import annotations

from . import accel as _accel

_accel.install()  # the compiled build of the hot modules, when there is a current one (accel.py)

from gymnasium.envs.registration import register, registry  # noqa: E402

ENV_ID = "JigsawCluster-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="jigsaw_env.env:JigsawClusterEnv")

__all__ = ["ENV_ID"]
