# placeholder: the Slurm checks land here (issue 6)
