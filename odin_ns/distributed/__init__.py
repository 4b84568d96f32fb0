"""The distributed step of odin-splatfacto, one concept per module.

- ``session_api``: ``TrainingSession``, what ``OdinTrainer`` calls before and after backward,
  and the step's data (``StepReads``, ``StepTiming``);
- ``session_flow``: ``SessionFlow``, the step flow both layouts share;
- ``session``: ``ReplicatedSession``, the replicated layout (every rank holds every Gaussian);
- ``sharded_session``: ``ShardedSession``, the sharded layout (one owner per Gaussian);
- ``phase``: phase boundaries, footprints (computed per rank, gathered), the AOT plan;
- ``densify``: gsplat's DefaultStrategy on statistics summed across ranks (the only user of
  gsplat's private strategy functions);
- ``optimizer_binding``: moments, learning rates and step counts of nerfstudio's optimizers;
- ``telemetry``: step and phase logs, the viewer snapshot, ``odin_run.json``.
"""
