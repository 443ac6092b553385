# Analysis: layer-wise self-similarity and anisotropy of every model on held-out sentences, the [CLS]
# cosines of random and of similar sentence pairs, two plots, and sentence embeddings without fine-tuning
# (STS-B dev, clustering of a labelled set).


localrules:
    similarity_plot,  # a few seconds of plotting: not worth a queue wait
    embeddings_data,  # reads the GLUE source (the Hub on the login node)


rule similarity:
    # one job per model for the representation analyses (the model is loaded once): self-similarity,
    # anisotropy and [CLS] cosines on held-out sentences, sentence embeddings on STS-B dev and the labelled set
    input:
        **embeddings_files()[0],
        model=f"{MODELS}/{{model}}",
        heldout=f"{DATA}/heldout.txt",
    output:
        **embeddings_files()[1],
        similarity=f"{R}/analysis/similarity/{{model}}.json",
    log:
        f"{LOGS}/analysis/similarity-{{model}}.log",
    benchmark:
        f"{BENCH}/analysis/similarity-{{model}}.tsv"
    conda:
        CONDA_ENV
    resources:
        **gpu_resources("similarity"),
        runtime=similarity_runtime,
        mem_mb=16000,
    params:
        device=operational(config["device"]),
        n=config["analysis"]["similarity_sentences"],
        seed=config["analysis"]["similarity_seed"],
        max_len=config["analysis"]["similarity_max_len"],
        version=RESULT_VERSIONS["analysis"],
        embeddings=embeddings_args,
    shell:
        "python -m tacl analysis similarity --model {input.model} --name {wildcards.model}"
        " --heldout {input.heldout} --sentences {params.n} --seed {params.seed} --max-len {params.max_len}"
        " --device {params.device} --out {output.similarity} {params.embeddings} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule similarity_plot:
    input:
        expand(f"{R}/analysis/similarity/{{model}}.json", model=finetune_models()),
    output:
        similarity=report(
            f"{REPORT}/self_similarity.png",
            category="Self-similarity",
            caption="../report/self_similarity.rst",
        ),
        cls=report(
            f"{REPORT}/cls_cosine.png",
            category="Self-similarity",
            caption="../report/cls_cosine.rst",
        ),
    log:
        f"{LOGS}/analysis/similarity_plot.log",
    conda:
        CONDA_ENV
    shell:
        "python -m tacl analysis plot --inputs {input} --out {output.similarity} --cls-out {output.cls} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"


rule embeddings_data:
    output:
        f"{R}/analysis/embeddings_data.json",
    log:
        f"{LOGS}/analysis/embeddings_data.log",
    conda:
        CONDA_ENV
    params:
        cache=operational(DATASETS_CACHE),
        source=lambda w: stamp(embeddings_source()),
        task=config["analysis"]["embeddings"]["cluster_task"],
        pairs=config["analysis"]["embeddings"]["max_pairs"],
        sentences=config["analysis"]["embeddings"]["max_sentences"],
    shell:
        "python -m tacl analysis embeddings-data --source {params.source:q} --cache-dir {params.cache}"
        " --cluster-task {params.task}"
        " --max-pairs {params.pairs} --max-sentences {params.sentences} --out {output} > {log} 2>&1"
        f"{RECORD_OUTPUTS}"
