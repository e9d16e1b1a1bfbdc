"""Where shards run: here (local), as SLURM array tasks or as Ray tasks. The executor decides
where a shard runs; the shard runner (``mmirage.core.shard``) decides how it runs.

``base.Executor`` is the interface (``run``, ``retry``, ``check``); ``local.LocalExecutor``
runs shards in this process or as parallel child processes (``parallel``);
``slurm_run.SlurmExecutor`` submits them as ``sbatch`` arrays (``slurm``, ``slurm_client``,
``slurm_script``); ``ray_run.RayExecutor`` runs them as Ray tasks (``ray_cluster``,
``ray_task``, ``ray_env``, ``ray_state_check``). A new executor subclasses ``Executor`` and
registers itself for its ``execution_params.mode`` with ``registry.register_executor``; the CLI
looks it up there.
"""
