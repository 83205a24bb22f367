"""Starting jobs: deepspeed launcher command lines, hostfiles and SLURM scripts (no torch)."""
