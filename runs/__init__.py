"""What a run leaves in the store and how it is read, torch-free: the run log's files, the lease, the goodput
ledger, the staging owner records, the catalog of runs and one view of a run. Below ``training``, above ``storage``."""
