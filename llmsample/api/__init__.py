"""The Python API: :class:`~llmsample.api.public.Engine` for notebooks and scripts, and the engine
in this process that the CLI's commands run on (:mod:`llmsample.api.local`)."""
