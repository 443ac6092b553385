# Fine-tunes: data fetched or checked once per task (login node), then one job per (model, task, setting)
# that trains its seeds one after the other, then the setting selected on dev per (model, task).

from tacl.finetune import CONTRASTIVE_FORM_PATTERN

# a fine-tuned model's name: the start model, an objective, or MODEL+FORM (contrastive fine-tuning)
FINETUNED_MODEL_PATTERN = rf"[a-z][a-z0-9_]*(\+({CONTRASTIVE_FORM_PATTERN}))?"


localrules:
    prepare_task,
    select_setting,
    submissions,


rule prepare_task:
    output:
        f"{R}/finetune_data/{{task}}.json",
    log:
        f"{LOGS}/finetune/prepare-{{task}}.log",
    conda:
        CONDA_ENV
    params:
        cache=operational(DATASETS_CACHE),
        source=lambda w: stamp(task_source(w.task)),
    shell:
        "python -m tacl finetune prepare --task {wildcards.task} --source {params.source:q}"
        " --cache-dir {params.cache} --out {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule finetune:
    # every seed of one (model, task, setting) in one job, one after the other or finetune.seeds_per_gpu at
    # once (tacl.finetune.seeds, tacl.finetune.side_by_side: a seed done before with the same settings and
    # start model is kept, one stopped halfway goes on from its checkpoint); the setting's name carries its
    # values
    input:
        unpack(finetune_start),
        data=f"{R}/finetune_data/{{task}}.json",
    output:
        f"{FINETUNE}/{{model}}/{{task}}/{{setting}}/seeds.json",
    log:
        f"{LOGS}/finetune/{{model}}/{{task}}/{{setting}}.log",
    benchmark:
        f"{BENCH}/finetune/{{model}}/{{task}}/{{setting}}.tsv"
    wildcard_constraints:
        model=FINETUNED_MODEL_PATTERN,
        setting=r"lr[^/]+",
    conda:
        CONDA_ENV
    resources:
        **gpu_resources("finetune"),
        runtime=finetune_runtime,
        mem_mb=finetune_mem,
    params:
        cache=operational(DATASETS_CACHE),
        device=operational(config["device"]),
        compile=operational(str(config["finetune"]["compile"]).lower()),
        shapes=operational(config["finetune"]["shapes"]),
        checkpoint=operational(config["finetune"]["checkpoint_minutes"]),
        side_by_side=operational(config["finetune"]["seeds_per_gpu"]),
        tracking=finetune_tracking,
        family=lambda w: task_family(w.task),
        seeds=lambda w: " ".join(str(s) for s in task_seeds(w.task)),
        source=lambda w: stamp(task_source(w.task)),
        hparams=lambda w: stamp(setting_hparams(w.task, w.setting)),
        precision=config["finetune"]["precision"],
        preset=config["finetune"]["preset"],
        version=RESULT_VERSIONS["finetune"],
        contrastive=lambda w: f"--contrastive {w.model.split('+')[1]}" if "+" in w.model else "",
        start=start_args,
        keep=lambda w: "--save-model" if keeps_weights(w.task) else "",
        out=lambda w: setting_dir(w.model, w.task, w.setting),
    shell:
        "python -m tacl finetune {params.family} {params.start} --task {wildcards.task}"
        " --seeds {params.seeds} --source {params.source:q} --cache-dir {params.cache}"
        " --hparams {params.hparams:q} --precision {params.precision} --device {params.device}"
        " --compile {params.compile} --shapes {params.shapes} --checkpoint-minutes {params.checkpoint}"
        " --seeds-per-gpu {params.side_by_side} {params.tracking}"
        " --preset {params.preset} {params.contrastive}"
        " {params.keep} --out {params.out} --marker {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS} --also {{params.out}}"


rule select_setting:
    # for each (model, task): the setting with the best mean dev score over seeds (a task that starts from
    # another's selected fine-tune, finetune.start_from, waits for it)
    input:
        selection_inputs,
    output:
        f"{FINETUNE}/{{model}}/{{task}}/selected.json",
    log:
        f"{LOGS}/finetune/{{model}}/{{task}}/select.log",
    wildcard_constraints:
        model=FINETUNED_MODEL_PATTERN,
    conda:
        CONDA_ENV
    shell:
        "python -m tacl finetune select --task {wildcards.task} --runs {input} --out {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule submissions:
    # one zip per model: the GLUE test-server files and SQuAD predictions of each task's selected setting
    input:
        lambda w: [selection_file(w.model, t) for t in tasks_of(w.model)],
    output:
        f"{REPORT}/submissions/{{model}}.zip",
    log:
        f"{LOGS}/finetune/{{model}}/submissions.log",
    conda:
        CONDA_ENV
    shell:
        "python -m tacl finetune submissions --selections {input} --out {output} > {log} 2>&1" f"{RECORD_OUTPUTS}"
