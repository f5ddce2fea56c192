"""Scale-out: pre-submission checks for cluster profiles and a private one-node Slurm for tests."""
