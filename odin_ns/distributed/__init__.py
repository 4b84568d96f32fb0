"""The distributed step of odin-splatfacto, one concept per module.

- ``session``: ``DistributedSession``, what ``OdinTrainer`` calls before and after backward;
- ``phase``: phase boundaries, footprints (computed per rank, gathered), the AOT plan;
- ``densify``: gsplat's DefaultStrategy on statistics summed across ranks (the only user of
  gsplat's private strategy functions);
- ``optimizer_binding``: moments, learning rates and step counts of nerfstudio's optimizers;
- ``telemetry``: step and phase logs, the viewer snapshot, ``odin_run.json``.
"""
