"""`tacl data ...`: download, clean, shard, gather."""

from __future__ import annotations

import argparse
import json
import sys


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("data", help="download, clean, tokenize + NSP, shards")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser("download", help="fetch the corpus into the local cache (login node)")
    c.add_argument("--source", required=True, help="data.source as JSON")
    c.add_argument("--cache-dir", required=True)
    c.add_argument("--out", required=True, help="corpus description (JSON) for the clean step")
    c.add_argument("--max-lines", type=int, default=0,
                   help="stream a Hugging Face dataset only as far as the clean step reads under this cap")
    c.add_argument("--heldout-fraction", type=float, default=0.0, help="as the clean step (for the cap)")
    c.add_argument("--sentence-splitter", default="blingfire", choices=["blingfire", "regex"],
                   help="as the clean step (for the cap)")
    c.add_argument("--stop-headings", type=json.loads, default=None,
                   help="as the clean step (for the cap)")
    c.add_argument("--stop-joiners", type=json.loads, default=None,
                   help="as the clean step (for the cap)")
    c.set_defaults(func=_download, online=True)

    c = cmds.add_parser("tokenizer", help="save the tokenizer into the results tree (login node)")
    c.add_argument("--name", required=True, help="HF name, local directory, or package:NAME")
    c.add_argument("--out", required=True)
    c.add_argument("--start-model", help="the start model (`model`), whose config's model_type is its family")
    c.add_argument("--family", help="the family of a random start model (model_init.family; default: bert)")
    c.set_defaults(func=_tokenizer, online=True)

    c = cmds.add_parser("clean", help="TaCL cleaning + sentence split")
    c.add_argument("--raw", required=True)
    c.add_argument("--corpus", required=True)
    c.add_argument("--index", required=True)
    c.add_argument("--heldout", required=True)
    c.add_argument("--stats", required=True)
    c.add_argument("--max-lines", type=int, default=0)
    c.add_argument("--heldout-fraction", type=float, default=0.0)
    c.add_argument("--workers", type=int, default=1)
    c.add_argument("--sentence-splitter", default="blingfire", choices=["blingfire", "regex"],
                   help="regex: the reference's splitter and stop rule")
    c.add_argument("--stop-headings", type=json.loads, default=None,
                   help="the stop headings as a JSON list (data.language's or data.stop_headings; default: English's)")
    c.add_argument("--stop-joiners", type=json.loads, default=None,
                   help="the words that join two stop headings into one, as a JSON list (data.language's 'and')")
    c.set_defaults(func=_clean)

    c = cmds.add_parser("headings", help="count the headings that close a corpus's articles (for data.stop_headings)")
    where = c.add_mutually_exclusive_group(required=True)
    where.add_argument("--raw", help="the corpus description the download step wrote (raw.json)")
    where.add_argument("--source", type=json.loads,
                       help="data.source as JSON, e.g. '{\"kind\": \"wikiextractor\", \"paths\": [\"wiki/*/wiki_*\"]}'")
    c.add_argument("--cache-dir", help="the datasets cache of a Hugging Face source (--source)")
    c.add_argument("--top", type=int, default=20, help="how many headings to print")
    c.add_argument("--max-articles", type=int, help="read only the first N articles")
    c.add_argument("--prose-words", type=int, default=30,
                   help="a line of this many words or more is the article's body, not a reference line (default 30)")
    c.add_argument("--min-share", type=float, default=0.75,
                   help="list a heading that closes at least this share of the articles it appears in (default 0.75)")
    c.set_defaults(func=_headings)

    c = cmds.add_parser("shard", help="tokenize + NSP instances for one shard")
    c.add_argument("--corpus", required=True)
    c.add_argument("--index", required=True)
    c.add_argument("--tokenizer", required=True)
    c.add_argument("--shard", type=int, required=True)
    c.add_argument("--num-shards", type=int, required=True)
    c.add_argument("--max-len", type=int, required=True)
    c.add_argument("--short-seq-prob", type=float, required=True)
    c.add_argument("--seed", type=int, required=True)
    c.add_argument("--dupe-factor", type=int, default=1)
    c.add_argument("--out", required=True, help="shard file (.bin); its entry goes next to it as .json")
    c.add_argument("--entry", required=True)
    c.set_defaults(func=_shard)

    c = cmds.add_parser("gather", help="write the shard manifest and print a summary")
    c.add_argument("--entries", nargs="+", required=True)
    c.add_argument("--clean-stats", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--summary", required=True)
    c.set_defaults(func=_gather)

    c = cmds.add_parser("verify", help="check every shard of a manifest against its sha256")
    c.add_argument("manifest")
    c.add_argument("--tokenizer", help="fail unless the shards were written with this tokenizer")
    c.set_defaults(func=_verify)


def _tokenizer(a: argparse.Namespace) -> None:
    from tacl.data.download import fetch_tokenizer

    fetch_tokenizer(a.name, a.out, a.family, a.start_model)


def _download(a: argparse.Namespace) -> None:
    from tacl.data.download import download_corpus

    from tacl.data.headings import rule_given

    download_corpus(json.loads(a.source), a.cache_dir, a.out, a.max_lines, a.heldout_fraction, a.sentence_splitter,
                    rule_given(a.stop_headings, a.stop_joiners))


def _clean(a: argparse.Namespace) -> None:
    from tacl.data.clean import clean_corpus
    from tacl.data.headings import rule_given

    stops = rule_given(a.stop_headings, a.stop_joiners)
    stats = clean_corpus(a.raw, a.corpus, a.index, a.heldout, a.stats, a.max_lines or None,
                         a.heldout_fraction, a.workers, progress=True, splitter=a.sentence_splitter, stops=stops)
    print(json.dumps(stats))


def _headings(a: argparse.Namespace) -> None:
    from tacl.data.headings import corpus_headings, headings_table

    found = corpus_headings(a.raw, a.source, a.cache_dir, a.prose_words, a.max_articles)
    print(headings_table(found, a.top, a.min_share))


def _shard(a: argparse.Namespace) -> None:
    from tacl.data.build import build_shard

    entry = build_shard(a.corpus, a.index, a.tokenizer, a.shard, a.num_shards, a.max_len, a.short_seq_prob,
                        a.seed, a.out, a.entry, a.dupe_factor, progress=sys.stderr.isatty())
    print(json.dumps({k: entry[k] for k in ("shard", "documents", "examples", "tokens")}))


def _gather(a: argparse.Namespace) -> None:
    from tacl.data.build import gather_shards, unknown_line, unknown_text
    from tacl.data.shards import EXAMPLES, manifest_form
    from tacl.runtime.io import read_json, write_json_atomic

    manifest = gather_shards(a.entries, a.out)
    clean = read_json(a.clean_stats)
    t = manifest["totals"]
    summary = {"documents": clean["documents"], "sentences": clean["sentences"],
               "heldout_documents": clean["heldout_documents"], "examples": t["examples"],
               "tokens": t["tokens"], "shards": t["shards"], "random_next": t["random_next"]}
    if "unk_tokens" in t:
        summary.update(unk_tokens=t["unk_tokens"], tokenizer=manifest["tokenizer"]["name"])
    write_json_atomic(a.summary, summary)
    what = EXAMPLES[manifest_form(manifest)]
    unknown = unknown_text(t.get("unk_tokens"), t["tokens"])
    print("data: {documents} documents, {sentences} sentences -> {examples} {what}, "
          "{tokens} tokens{unknown} in {shards} shards".format(what=what, unknown=unknown, **summary))
    if warning := unknown_line(summary.get("unk_tokens"), t["tokens"], summary.get("tokenizer")):
        print(warning)


def _verify(a: argparse.Namespace) -> None:
    from tacl.data.shards import ShardSet

    expected = None
    if a.tokenizer:
        from tacl.runtime.hub import load_tokenizer, tokenizer_hash

        expected = tokenizer_hash(load_tokenizer(a.tokenizer))
    shards = ShardSet(a.manifest, tokenizer_hash=expected, verify=True, tokenizer_name=f"tokenizer {a.tokenizer!r}")
    print(f"{a.manifest}: {len(shards.shards)} shards, {len(shards)} examples, all sha256 match")
