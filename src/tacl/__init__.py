"""Token-contrastive BERT pretraining (TaCL, TACO, MLM+NSP) on SLURM, as one Snakemake workflow."""

__version__ = "0.1.0"
