"""specstudy: the Python that the Snakemake rules run."""
