"""Where shards run: here (local) or as SLURM array tasks. The executor decides where a
shard runs; the shard runner (``mmirage.core.shard``) decides how it runs.

``base.Executor`` is the interface (``run``, ``retry``, ``check``); ``local.LocalExecutor``
runs shards in this process or as parallel child processes (``parallel``);
``slurm_run.SlurmExecutor`` submits them as ``sbatch`` arrays (``slurm``, ``slurm_client``,
``slurm_script``). A new executor subclasses ``Executor`` and registers itself for its
``execution_params.mode`` with ``registry.register_executor``; the CLI looks it up there.
"""
