"""A fine-tuning seed's tracked run (config `tracking`: W&B, MLflow; tacl.runtime.tracking): one per (model,
task, setting, seed), grouped by model and task, tagged with the model's objective and contrastive form and
the task's family, its hyperparameters as the run's params, its scores (`<split>.<metric>`: dev, and a
declared task's labelled test), training record, device and precision as the run's final values. Its ids
are kept in the seed's folder (SEED_STATE, hidden, so not among the seed's result files): a seed stopped by
its job's time limit goes on in the same tracked run in the next job. Seeds side by side are processes of
their own, each with its own run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tacl.finetune import TASKS, Stopped
from tacl.runtime.io import stable_hash
from tacl.runtime.tracking import FAILED, FINISHED, SCHEDULED, SEED_STATE, RunInfo, TrackedRun, flat


def seed_info(spec: dict[str, Any], task: str, seed: int, out: Path, given: dict[str, Any]) -> RunInfo:
    """The seed's RunInfo: the model, task and setting as the workflow names them (`spec`'s labels; by hand,
    the seed's folder MODEL/TASK/SETTING/seedN), `given` (its given.json: settings and start model) deciding
    its identity."""
    parts = Path(out).resolve().parts
    model = spec.get("model") or (parts[-4] if len(parts) >= 4 else "model")
    setting = spec.get("setting") or (parts[-2] if len(parts) >= 2 else "setting")
    objective, _, form = model.partition("+")
    family = TASKS.get(task) or (given.get("source") or {}).get("kind", "declared")
    tags = {"objective": objective, "family": family, "model": model, "task": task, "setting": setting,
            "seed": str(seed), **({"contrastive": form} if form else {})}
    tags.update((k, str(v)) for k, v in flat(spec.get("cost") or {}, "plan.").items())
    return RunInfo(kind="finetune", name=f"{model}/{task}/{setting}/seed{seed}", group=f"{model}/{task}",
                   identity=stable_hash({**given, "seed": seed, "model": model, "task": task, "setting": setting}, 12),
                   tags=tags,
                   params=flat({"seed": seed, "model": model, "task": task, "setting": setting, **given}),
                   config={"given": given, "seed": seed, "cost": spec.get("cost")})


def tracked_seed(spec: dict[str, Any] | None, task: str, seed: int, out: Path, given: dict[str, Any],
                 train: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`train()` (one seed, its metrics.json's record returned) inside its tracked run, where `spec` asks for
    one: the run ends finished with the record's scores, waiting where the seed stopped to go on later
    (tacl.finetune.Stopped), failed where training failed (the error propagates as it would untracked)."""
    if spec is None:
        return train()
    run = TrackedRun(spec, Path(out) / SEED_STATE, seed_info(spec, task, seed, out, given))
    try:
        result = train()
    except Stopped:
        run.close(SCHEDULED)
        raise
    except BaseException:
        run.close(FAILED)
        raise
    scores = {split: values for k in ("dev", "test") for split, values in (result.get(k) or {}).items()}
    run.summary(flat({**scores, "train": result.get("train") or {}, "wall_s": result.get("wall_s")}))
    run.tags(flat({"device": result.get("device") or {}, "precision": "bf16" if result.get("bf16") else "fp32"}))
    run.close(FINISHED)
    return result
