"""The results folder of one experiment (config `results_dir`): where each stage writes, in one place.

The workflow's rules, its plan, the rerun summary, the report and `tacl submit pretrain` all name their files
from here, so that they agree. Paths are plain strings (Snakemake's patterns and the plan compare them as
text); a wildcard pattern is the same path with `{objective}`, `{model}`... in it. Standard library only: any
stage may import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """The paths under one results folder."""

    results: str

    @classmethod
    def of(cls, config: dict[str, Any]) -> Layout:
        return cls(config["results_dir"])

    @property
    def data(self) -> str:
        return f"{self.results}/data"

    @property
    def logs(self) -> str:
        return f"{self.results}/logs"

    @property
    def benchmarks(self) -> str:
        return f"{self.results}/benchmarks"

    @property
    def models(self) -> str:
        return f"{self.results}/models"

    @property
    def start(self) -> str:
        """The start model every pretraining run (and objective `none`) begins from."""
        return f"{self.models}/start"

    @property
    def pretrain(self) -> str:
        return f"{self.results}/pretrain"

    @property
    def finetune(self) -> str:
        return f"{self.results}/finetune"

    @property
    def report(self) -> str:
        return f"{self.results}/report"

    @property
    def analysis(self) -> str:
        return f"{self.results}/analysis"

    @property
    def tracking(self) -> str:
        """The experiment trackers' own files (tacl.runtime.tracking): MLflow's file store, W&B's offline runs."""
        return f"{self.results}/tracking"

    @property
    def manifest(self) -> str:
        """The shards' manifest, what pretraining reads."""
        return f"{self.data}/shards/manifest.json"

    @property
    def data_summary(self) -> str:
        """The data stage's counts (tokens, mean length), once it has run."""
        return f"{self.data}/summary.json"

    def model(self, name: str) -> str:
        """An exported (or extra) model's folder; its summary is `model_summary`."""
        return f"{self.models}/{name}"

    def model_summary(self, name: str) -> str:
        return f"{self.models}/{name}.json"

    @property
    def publish(self) -> str:
        """The Hub-ready folders of the exported models (`tacl publish`), beside `models`."""
        return f"{self.results}/publish"

    def hub_folder(self, name: str) -> str:
        """An exported model as the Hugging Face Hub takes it: its files (hard links to the export's), a model
        card (README.md) and the records of what made it."""
        return f"{self.publish}/{name}"

    def pretrain_run(self, objective: str) -> str:
        """A pretraining run's folder (checkpoints, metrics, lock): a param of the chunks, never an output."""
        return f"{self.pretrain}/{objective}/run"

    def chunk_marker(self, objective: str, k: int | str) -> str:
        return f"{self.pretrain}/{objective}/chunk-{k}.json"

    def task_data(self, task: str) -> str:
        """What prepare_task found of a task's data (its split sizes)."""
        return f"{self.results}/finetune_data/{task}.json"

    def setting_dir(self, model: str, task: str, setting: str) -> str:
        return f"{self.finetune}/{model}/{task}/{setting}"

    def run_dir(self, run: dict[str, Any]) -> str:
        """One fine-tuning seed's folder: `run` has model, task, setting and seed."""
        return f"{self.setting_dir(run['model'], run['task'], run['setting'])}/seed{run['seed']}"

    def seeds_marker(self, model: str, task: str, setting: str) -> str:
        """The output of one fine-tuning job: every seed of a (model, task, setting), one after the other."""
        return f"{self.setting_dir(model, task, setting)}/seeds.json"

    def selection_file(self, model: str, task: str) -> str:
        return f"{self.finetune}/{model}/{task}/selected.json"

    def submissions(self, model: str) -> str:
        return f"{self.report}/submissions/{model}.zip"

    def similarity(self, model: str) -> str:
        return f"{self.analysis}/similarity/{model}.json"

    @property
    def embeddings_data(self) -> str:
        return f"{self.analysis}/embeddings_data.json"

    def embeddings(self, model: str) -> str:
        return f"{self.analysis}/embeddings/{model}.json"

    @property
    def similarity_png(self) -> str:
        return f"{self.report}/self_similarity.png"

    @property
    def cls_png(self) -> str:
        return f"{self.report}/cls_cosine.png"
