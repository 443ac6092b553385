"""Fine-tuning and evaluation: GLUE, SQuAD, CoNLL-2003 NER."""

# What a fine-tuning preset fixes (`finetune.preset`); a task family's defaults and the config's hparams go
# around it (tacl.finetune.common.hyperparameters). reference: what the TaCL reference passed, i.e. the Hugging
# Face Trainer's defaults (no warmup, no weight decay, linear decay, AdamW eps 1e-8, clipping at 1.0).
# standard: 10% warmup and weight decay 0.01.
PRESETS = {"reference": {"warmup_ratio": 0.0, "weight_decay": 0.0},
           "standard": {"warmup_ratio": 0.1, "weight_decay": 0.01}}
