"""Token-contrastive BERT pretraining (TaCL, TACO, MLM+NSP) on SLURM, as one Snakemake workflow."""

__version__ = "0.1.0"

# The version of what each stage's jobs produce. Bump a stage's number in the commit that changes what its
# jobs compute (a loss, masking, batching, a metric), never for speed, logging or messages: the workflow
# passes it to the stage's rules among their parameters, and with the profiles' rerun triggers (mtime,
# params, input; not Snakemake's `code`) a project update reruns finished jobs only where it changes their
# results. "pretrain" is also part of a run's identity (tacl.pretrain.settings): a bump starts runs again.
RESULT_VERSIONS = {"data": 1, "pretrain": 3, "finetune": 1, "analysis": 2}
