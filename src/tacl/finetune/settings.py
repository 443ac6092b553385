"""What each seed of a fine-tuning job is given, as plain data (`FineTune`): made once from the command line
(`tacl finetune glue|squad|ner`, tacl.finetune.cli) and read by the task family's fine-tune
(tacl.finetune.sequence, qa, ner), which takes it with the seed and the seed's folder (the two that differ
between the seeds of one job). No heavy import here: the command line builds it before torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tacl.finetune import TASKS, declared, finetune_given
from tacl.runtime.io import with_cache

if TYPE_CHECKING:
    from tacl.finetune.resume import Checkpointing


@dataclass(frozen=True)
class FineTune:
    """One (model, task, setting) fine-tune, every seed's part of it but the seed: the start model, the
    task and its data, the hyperparameters and how the seed runs. `contrastive`, `start_from` and
    `save_model` are GLUE's (the other families take none)."""

    task: str  # one of tacl.finetune.TASKS, or a declared task (its declaration as `source`)
    model: str  # the start model: a Hugging Face directory or a Hub name (resolved where the seed trains)
    source: dict[str, Any]  # the task's data source, as given (given.json records it)
    hparams: dict[str, Any] = field(default_factory=dict)  # the config's, over the family's and the preset's
    cache_dir: str | None = None  # the Hugging Face datasets cache (`data_source`; a source's own wins)
    precision: str = "auto"  # auto | bf16 | fp32
    preset: str = "standard"  # tacl.finetune.PRESETS
    device: str = "auto"  # auto | cuda | cpu
    compile: bool | str = "auto"  # finetune.compile: true, false, auto
    shapes: str = "auto"  # finetune.shapes: auto, exact, buckets
    contrastive: str | None = None  # a contrastive term on [CLS] (tacl.finetune.CONTRASTIVE_FORMS)
    start_from: str | None = None  # where `model` came from: another task's fine-tune, TASK:SETTING/seedN
    save_model: bool = False  # keep the fine-tuned encoder, without its head, in the seed's model/
    checkpointing: Checkpointing | None = None  # checkpoints inside the seed (tacl.finetune.resume)

    @property
    def family(self) -> str | None:
        """glue, squad or ner: a built-in task's, or a declared task's kind's (its declaration as `source`);
        None for neither."""
        if declared.is_declared(self.source):
            return declared.family(self.source) if self.source.get("kind") in declared.KINDS else None
        return TASKS.get(self.task)

    @property
    def declaration(self) -> dict[str, Any] | None:
        """A declared task's declaration, as its data is read (with the datasets cache folder); None for a
        built-in task."""
        return self.data_source() if declared.is_declared(self.source) else None

    def data_source(self) -> dict[str, Any]:
        """The data source as the seed reads it: with the datasets cache folder (tacl.runtime.io.with_cache)."""
        return with_cache(self.source, self.cache_dir)

    def given(self) -> dict[str, Any]:
        """What a seed's given.json records of the settings (tacl.finetune.finetune_given; the job adds the
        start model's weights)."""
        return finetune_given(self.source, self.hparams, self.precision, self.preset)

    def checkpoint_at(self, seed_dir: str | Path) -> Checkpointing | None:
        """How the seed in `seed_dir` checkpoints (tacl.finetune.common.train's `checkpoint`); None where
        the fine-tune keeps no checkpoint."""
        return self.checkpointing.at(seed_dir) if self.checkpointing else None
