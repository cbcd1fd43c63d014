"""jigsaw_executor.

The live PyTorch executor (docs/design.md section 3). Part 1, real SPB data-parallel training
(docs/executor.md):

* :mod:`jigsaw_executor.spb_worker`: ``SPBTrainer`` (one worker: no-grad forward below its start
  group, per-group gradient sync over the contributors, BatchNorm buffer sync, byte accounting by
  the simulator's convention, checkpoints) and ``IterationReport``;
* :mod:`jigsaw_executor.launcher`: ``run_job_local`` (one job as local gloo/NCCL worker
  processes, failures surfaced as ``JobFailed`` naming the rank), ``Decision``;
* :mod:`jigsaw_executor.data`: sklearn digits with a deterministic per-rank sampler, synthetic data;
* :mod:`jigsaw_executor.models`: zoo models plus ``tiny_bn_cnn``, exact-bytes cost tables.

Nothing is imported here, so ``import jigsaw_executor`` stays cheap.
"""
