"""What every provider's batch API shares: input files, jobs and their fates, the runner
that answers them, the file store, HTTP helpers."""
