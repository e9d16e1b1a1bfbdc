#!/bin/bash
# Written by mmirage: one array task per shard. Submitted with `sbatch --parsable FILE`.
#SBATCH --job-name=mmirage-sharded
#SBATCH --array=0-3
#SBATCH --chdir=/data/pipelines
#SBATCH --output=/r/R-%x.%A_%a.out
#SBATCH --error=/r/R-%x.%A_%a.err
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=288
#SBATCH --time=11:59:59
#SBATCH --signal=B:TERM@120
#SBATCH --account=a-proj
#SBATCH --gres=gpu:4
#SBATCH --requeue
set -eo pipefail
export MMIRAGE_SLURM_DEADLINE=$(( $(date +%s) + 43199 ))
export MMIRAGE_SLURM_KILL_WAIT=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
export HF_HOME=/h
exec /opt/venv/bin/python -P -m mmirage --log-level WARNING run /data/pipelines/caption.yaml --shard-id "$SLURM_ARRAY_TASK_ID"
