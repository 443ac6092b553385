# Pretraining: start model (login node) -> chunk 0 -> chunk 1 -> ... (as many as needed) -> export.
# The run directory (checkpoints, metrics, lock) is passed as a param, never declared as an output:
# Snakemake deletes outputs before a job runs and after it fails. `priority: 10`: see data.smk.


localrules:
    init_model,
    export_start,
    extra_model,


rule init_model:
    input:
        tokenizer=f"{DATA}/tokenizer",
    output:
        directory(START),
    log:
        f"{LOGS}/pretrain/init_model.log",
    priority: 10
    conda:
        CONDA_ENV
    params:
        model=config["model"],
        init=stamp(design.start_model_init(config)),
    shell:
        "python -m tacl pretrain init-model --model {params.model:q} --init {params.init:q}"
        " --tokenizer {input.tokenizer} --out {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


checkpoint pretrain_chunk:
    input:
        manifest=f"{DATA}/shards/manifest.json",
        start=START,
        previous=previous_chunk,
    output:
        f"{PRETRAIN}/{{objective}}/chunk-{{chunk}}.json",
    log:
        f"{LOGS}/pretrain/{{objective}}/chunk-{{chunk}}.log",
    benchmark:
        f"{BENCH}/pretrain/{{objective}}/chunk-{{chunk}}.tsv"
    wildcard_constraints:
        objective=OBJECTIVE_PATTERN,
        chunk=r"\d+",
    priority: 10
    conda:
        CONDA_ENV
    resources:
        **chunk_resources(),
    params:
        run_dir=lambda w: f"{PRETRAIN}/{w.objective}/run",
        settings=lambda w: train_settings(w.objective),
        launch=operational(chunk_launch()[0]),
        operational=chunk_arguments,
        runtime=chunk_minutes,
    shell:
        "{params.launch} python -m tacl pretrain train --run-dir {params.run_dir} --start-model {input.start}"
        " --manifest {input.manifest} --settings {params.settings:q} --chunk {wildcards.chunk}"
        " --marker {output} --runtime-minutes {params.runtime} {params.operational} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule export_model:
    input:
        final=final_chunk,
        start=START,
    output:
        model=directory(f"{MODELS}/{{objective}}"),
        summary=f"{MODELS}/{{objective}}.json",
    log:
        f"{LOGS}/pretrain/{{objective}}/export.log",
    benchmark:
        f"{BENCH}/pretrain/{{objective}}/export.tsv"
    wildcard_constraints:
        objective=OBJECTIVE_PATTERN,
    priority: 10
    conda:
        CONDA_ENV
    resources:
        mem_mb=16000,
        runtime=60,
    params:
        run_dir=lambda w: f"{PRETRAIN}/{w.objective}/run",
        cleanup=operational("--remove-checkpoints" if config["pretrain"]["remove_checkpoints"] else ""),
    shell:
        "python -m tacl pretrain export --start-model {input.start} --run-dir {params.run_dir}"
        " --marker {input.final} --out {output.model} --summary {output.summary} {params.cleanup} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule export_start:
    input:
        start=START,
    output:
        model=directory(f"{MODELS}/none"),
        summary=f"{MODELS}/none.json",
    log:
        f"{LOGS}/pretrain/none/export.log",
    conda:
        CONDA_ENV
    shell:
        "python -m tacl pretrain export --start-model {input.start} --out {output.model}"
        " --summary {output.summary} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule extra_model:
    # finetune.extra_models: a model fine-tuned as it is (fetched on the login node like the start model)
    output:
        directory(f"{MODELS}/{{model}}"),
    log:
        f"{LOGS}/pretrain/extra-{{model}}.log",
    wildcard_constraints:
        model="|".join(extra_models()) or "(?!)",
    conda:
        CONDA_ENV
    params:
        source=lambda w: config["finetune"]["extra_models"][w.model],
    shell:
        "python -m tacl pretrain init-model --model {params.source:q} --tokenizer {params.source:q}"
        " --out {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"
