#!/bin/bash
# Written by mmirage: one array task per shard. Submitted with `sbatch --parsable FILE`.
#SBATCH --job-name=caption-all
#SBATCH --array=0-3%16
#SBATCH --chdir=/data/pipelines
#SBATCH --output=/scratch/reports/R-%x.%A_%a.out
#SBATCH --error=/scratch/reports/R-%x.%A_%a.err
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=72
#SBATCH --time=1-00:00:00
#SBATCH --signal=B:TERM@300
#SBATCH --account=a-proj
#SBATCH --reservation=hackathon
#SBATCH --partition=normal
#SBATCH --qos=high
#SBATCH --mem=64G
#SBATCH --constraint=gpu&h100
#SBATCH --gres=gpu:4
#SBATCH --requeue
#SBATCH --exclusive
#SBATCH --mail-type=END
set -eo pipefail
export MMIRAGE_SLURM_DEADLINE=$(( $(date +%s) + 86400 ))
export MMIRAGE_SLURM_KILL_WAIT=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
module load cuda/12.4
source /opt/venv/bin/activate
export HF_HOME=/scratch/hf
exec srun --environment=/etc/edf/env.toml /opt/venv/bin/python -P -m mmirage --log-level WARNING run /data/pipelines/caption.yaml --shard-id "$SLURM_ARRAY_TASK_ID"
