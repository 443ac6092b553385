# Data stage: download (login node) -> clean + sentence split -> tokenize + NSP, one job per shard -> manifest.
# `priority: 10` here and on the pretraining chain (pretrain.smk), 0 elsewhere: the DAG's longest path is taken
# first wherever more jobs are ready than the cores (or the profile's `jobs:`) allow. It changes no result.


localrules:
    download_corpus,
    fetch_tokenizer,
    gather_shards,


rule download_corpus:
    output:
        f"{DATA}/raw.json",
    log:
        f"{LOGS}/data/download_corpus.log",
    priority: 10
    conda:
        CONDA_ENV
    params:
        cache=operational(DATASETS_CACHE),
        source=stamp(config["data"]["source"]),
        # a Hugging Face source is streamed only as far as the clean step will read it under max_lines
        cap=(
            f"--max-lines {config['data']['max_lines']} --heldout-fraction {config['data']['heldout_fraction']}"
            f" --sentence-splitter {config['data']['sentence_splitter']}{clean_options()}"
        ),
    shell:
        "python -m tacl data download --source {params.source:q} --cache-dir {params.cache} {params.cap}"
        " --out {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule fetch_tokenizer:
    output:
        directory(f"{DATA}/tokenizer"),
    log:
        f"{LOGS}/data/fetch_tokenizer.log",
    priority: 10
    conda:
        CONDA_ENV
    params:
        # the start model's family (decides the shards' form) where the tokenizer's name does not decide it
        **start_family_given(),
        name=tokenizer_name(),
    shell:
        f"python -m tacl data tokenizer --name {{params.name:q}} {tokenizer_options()} --out {{output}} > {{log}} 2>&1"
        f"{RECORD_OUTPUTS}"


rule clean:
    input:
        f"{DATA}/raw.json",
    output:
        corpus=f"{DATA}/corpus.txt",
        index=f"{DATA}/corpus.idx.npy",
        heldout=f"{DATA}/heldout.txt",
        stats=f"{DATA}/clean.json",
    log:
        f"{LOGS}/data/clean.log",
    benchmark:
        f"{BENCH}/data/clean.tsv"
    priority: 10
    conda:
        CONDA_ENV
    threads: config["data"]["clean_workers"]
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        # the stop headings where they are not English's (data.language, data.stop_headings)
        **clean_language_given(),
        max_lines=config["data"]["max_lines"],
        heldout=config["data"]["heldout_fraction"],
        splitter=config["data"]["sentence_splitter"],
        version=RESULT_VERSIONS["data"],
    shell:
        "python -m tacl data clean --raw {input} --corpus {output.corpus} --index {output.index}"
        " --heldout {output.heldout} --stats {output.stats} --max-lines {params.max_lines}"
        " --heldout-fraction {params.heldout} --sentence-splitter {params.splitter} --workers {threads}"
        f"{clean_options()} > {{log}} 2>&1"
        f"{RECORD_OUTPUTS}"


rule shard:
    input:
        corpus=f"{DATA}/corpus.txt",
        index=f"{DATA}/corpus.idx.npy",
        tokenizer=f"{DATA}/tokenizer",
    output:
        shard=f"{DATA}/shards/shard-{{shard}}.bin",
        entry=f"{DATA}/shards/shard-{{shard}}.json",
    log:
        f"{LOGS}/data/shard-{{shard}}.log",
    benchmark:
        f"{BENCH}/data/shard-{{shard}}.tsv"
    wildcard_constraints:
        shard=r"\d{5}",
    priority: 10
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=6000,
        runtime=120,
    params:
        n=config["data"]["num_shards"],
        max_len=config["data"]["max_len"],
        short=config["data"]["short_seq_prob"],
        seed=config["data"]["seed"],
        dupe=config["data"]["dupe_factor"],
        version=RESULT_VERSIONS["data"],
    shell:
        "RAYON_NUM_THREADS={threads} python -m tacl data shard --corpus {input.corpus} --index {input.index}"
        " --tokenizer {input.tokenizer} --shard {wildcards.shard} --num-shards {params.n}"
        " --max-len {params.max_len} --short-seq-prob {params.short} --seed {params.seed}"
        " --dupe-factor {params.dupe} --out {output.shard} --entry {output.entry} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule gather_shards:
    input:
        entries=expand(f"{DATA}/shards/shard-{{shard}}.json", shard=SHARDS),
        stats=f"{DATA}/clean.json",
    output:
        manifest=f"{DATA}/shards/manifest.json",
        summary=f"{DATA}/summary.json",
    log:
        f"{LOGS}/data/gather_shards.log",
    priority: 10
    conda:
        CONDA_ENV
    shell:
        "python -m tacl data gather --entries {input.entries} --clean-stats {input.stats}"
        " --out {output.manifest} --summary {output.summary} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"
