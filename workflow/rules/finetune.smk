# Fine-tunes: data fetched or checked once per task (login node), then one job per (model, task, seed).


localrules:
    prepare_task,


rule prepare_task:
    output:
        f"{R}/finetune_data/{{task}}.json",
    log:
        f"{LOGS}/finetune/prepare-{{task}}.log",
    conda:
        CONDA_ENV
    params:
        source=lambda w: json.dumps(task_source(w.task)),
    shell:
        "python -m tacl finetune prepare --task {wildcards.task} --source {params.source:q} --out {output}"
        " > {log} 2>&1"


rule finetune:
    input:
        model=lambda w: f"{MODELS}/{w.model.split('+')[0]}",  # MODEL+FORM: a contrastive fine-tune of MODEL
        data=f"{R}/finetune_data/{{task}}.json",
    output:
        f"{FINETUNE}/{{model}}/{{task}}/seed{{seed}}/metrics.json",
    log:
        f"{LOGS}/finetune/{{model}}/{{task}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/finetune/{{model}}/{{task}}/seed{{seed}}.tsv"
    wildcard_constraints:
        seed=r"\d+",
        model=r"[a-z_]+(\+(kl|scl))?",
    conda:
        CONDA_ENV
    resources:
        runtime=lambda w: task_runtime(w.task),
        mem_mb=32000,
    params:
        family=lambda w: task_family(w.task),
        source=lambda w: json.dumps(task_source(w.task)),
        hparams=lambda w: json.dumps(task_hparams(w.task)),
        precision=config["finetune"]["precision"],
        device=config["device"],
        preset=config["finetune"]["preset"],
        contrastive=lambda w: f"--contrastive {w.model.split('+')[1]}" if "+" in w.model else "",
        out=lambda w: f"{FINETUNE}/{w.model}/{w.task}/seed{w.seed}",
    shell:
        "python -m tacl finetune {params.family} --model {input.model} --task {wildcards.task}"
        " --seed {wildcards.seed} --source {params.source:q} --hparams {params.hparams:q}"
        " --precision {params.precision} --device {params.device} --preset {params.preset} {params.contrastive}"
        " --out {params.out} > {log} 2>&1"
