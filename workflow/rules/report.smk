# Report: tables (Markdown, CSV, LaTeX) and plots from every finished run, beside the published numbers.
# Also built from whatever has finished when some job failed (onerror in the Snakefile), and at any time
# by `tacl report RESULTS_DIR` (from RESULTS_DIR/expected.json, which onstart writes): the same files, less
# the rule's record (tacl.report.expected.RECORD), which those remove, so that the rule runs again.


localrules:
    report,
    publish_model,


rule report:
    input:
        runs=finetune_outputs(),
        similarity=expand(f"{R}/analysis/similarity/{{model}}.json", model=finetune_models()),
        similarity_png=f"{REPORT}/self_similarity.png",
        cls_png=f"{REPORT}/cls_cosine.png",
        embeddings=embeddings_outputs(),
    output:
        report(
            multiext(f"{REPORT}/glue_dev", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="GLUE dev",
            caption="../report/glue_dev.rst",
        ),
        report(
            multiext(f"{REPORT}/squad_dev", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="SQuAD dev",
            caption="../report/squad_dev.rst",
        ),
        report(
            multiext(f"{REPORT}/glue_published", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="Published GLUE numbers",
            caption="../report/glue_published.rst",
        ),
        report(
            multiext(f"{REPORT}/differences", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="Differences beyond seed noise",
            caption="../report/differences.rst",
        ),
        report(
            multiext(f"{REPORT}/embeddings", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="Sentence embeddings",
            caption="../report/embeddings.rst",
        ),
        report(
            multiext(f"{REPORT}/anisotropy", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="Anisotropy",
            caption="../report/anisotropy.rst",
        ),
        report(
            multiext(f"{REPORT}/cls_cosine", ".md", ".csv", ".tex"),
            category="Tables",
            subcategory="[CLS] cosines",
            caption="../report/cls_cosine_table.rst",
        ),
        report(f"{REPORT}/glue_dev.png", category="GLUE dev", caption="../report/glue_plot.rst"),
        report(
            f"{REPORT}/training_curves.png",
            category="Pretraining",
            caption="../report/training_curves.rst",
        ),
        f"{REPORT}/training_curves.csv",
        f"{REPORT}/report.html",
        md=report(f"{REPORT}/report.md", category="Tables", caption="../report/report_md.rst"),
        # (written last, by this rule only: tables written otherwise never pass for this rule's)
        record=f"{REPORT}/{REPORT_RECORD}",
    log:
        f"{LOGS}/report.log",
    conda:
        CONDA_ENV
    params:
        args=report_args,
    shell:
        "python -m tacl report {params.args} --record {output.record} > {log} 2>&1" f"{RECORD_OUTPUTS}"


# `snakemake --profile ... publish` (the target rule `publish`, in the Snakefile): each pretrained model as the
# Hugging Face Hub takes it (tacl.report.publish), after the report, whose numbers its model card holds.
rule publish_model:
    input:
        model=f"{MODELS}/{{objective}}",
        summary=f"{MODELS}/{{objective}}.json",
        data=L.data_summary,
        report=f"{REPORT}/{REPORT_RECORD}",
    output:
        directory(f"{PUBLISH}/{{objective}}"),
    log:
        f"{LOGS}/publish/{{objective}}.log",
    wildcard_constraints:
        objective=OBJECTIVE_PATTERN,
    conda:
        CONDA_ENV
    params:
        # the results folder: RESULTS/publish/OBJECTIVE's grandparent
        results=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    shell:
        "python -m tacl publish {params.results} --models {wildcards.objective} > {log} 2>&1" f"{RECORD_OUTPUTS}"
