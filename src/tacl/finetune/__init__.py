"""Fine-tuning and evaluation: GLUE, SQuAD, CoNLL-2003 NER."""
