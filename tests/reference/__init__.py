"""Reference implementations the tests hold the package's fast paths to: plain, slow versions that
compute the same results from scratch, never used by the package.

- ``reference.simulator``: ``ReferenceSimulator``, the simulator's step with none of its
  incremental shortcuts (tests/sim/test_sim_step_parity.py);
- ``reference.env_step``: the env's masks, host slots, observation, 2D-LAS and placements
  (tests/env/test_env_speed_parity.py);
- ``reference.heuristics``: 2D-LAS, the pairs in force, the pairing search and Jigsaw's
  exclusive pass (tests/agents/test_scheduler_speed.py).
"""
