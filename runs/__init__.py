"""Run bookkeeping, torch-free: the run log, the run's lease and the catalog behind `pretrain runs`."""
