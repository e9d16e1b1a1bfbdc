"""Where shards run: here (local) or as SLURM array tasks. The executor decides where a
shard runs; the shard runner (``mmirage.core.shard``) decides how it runs."""
