"""Wikipedias in other languages: the sentence splitters on Croatian and Serbian text, each language's stop
rule (data.language, data.stop_headings; the rule itself in test_headings.py), and English's settings recorded
as they were before languages were (no rerun)."""

from __future__ import annotations

import pytest

from conftest import demo_config
from tacl.data.clean import _split, clean_article, clean_given
from tacl.data.headings import STOP_HEADINGS, STOP_MATCH, STOP_PREFIXES, TACL, stop_rule
from tacl.runtime.io import InputError

CROATIAN = ("Zagreb je glavni grad Hrvatske. Npr. u njemu živi oko 770 tisuća stanovnika, tzv. Zagrepčana. "
            "Grad leži na rijeci Savi, a spominje se 1094. godine. Što je čađa? Šećer, đak i žaba!")
SERBIAN = ("Београд је главни град Србије. Налази се на ушћу Саве у Дунав, нпр. код Калемегдана. "
           "Да ли је то тачно? Јесте!")


def test_blingfire_on_croatian_and_serbian():
    """blingfire keeps č ć đ š ž and Cyrillic intact, keeps "Npr." at a sentence's start, an ordinal
    ("1094. godine") and a lower-case word after "нпр." in their sentences; it falls short at "tzv." before a
    capitalised word, where it ends the sentence."""
    assert _split(CROATIAN, "blingfire") == [
        "Zagreb je glavni grad Hrvatske.",
        "Npr. u njemu živi oko 770 tisuća stanovnika, tzv.",
        "Zagrepčana.",
        "Grad leži na rijeci Savi, a spominje se 1094. godine.",
        "Što je čađa?",
        "Šećer, đak i žaba!",
    ]
    assert _split(SERBIAN, "blingfire") == [
        "Београд је главни град Србије.",
        "Налази се на ушћу Саве у Дунав, нпр. код Калемегдана.",
        "Да ли је то тачно?",
        "Јесте!",
    ]


def test_the_reference_splitter_on_croatian_and_serbian():
    """The reference's rules protect only English titles, suffixes and single Latin letters: every other dot
    ends a sentence, so it falls short at each abbreviation ("Npr.", "tzv.", "нпр.") and at an ordinal
    ("1094. godine"), which Croatian and Serbian write with a dot."""
    assert _split(CROATIAN, "regex") == [
        "Zagreb je glavni grad Hrvatske.",
        "Npr.",
        "u njemu živi oko 770 tisuća stanovnika, tzv.",
        "Zagrepčana.",
        "Grad leži na rijeci Savi, a spominje se 1094.",
        "godine.",
        "Što je čađa?",
        "Šećer, đak i žaba!",
    ]
    assert _split(SERBIAN, "regex") == [
        "Београд је главни град Србије.",
        "Налази се на ушћу Саве у Дунав, нпр.",
        "код Калемегдана.",
        "Да ли је то тачно?",
        "Јесте!",
    ]


ARTICLE = "\n".join([
    "Rijeka Sava",
    "Sava je rijeka u jugoistočnoj Europi. Teče kroz Sloveniju, Hrvatsku i Srbiju.",
    "Izvire u Julijskim Alpama. Ulijeva se u Dunav kod Beograda.",
    "Izvori",
    "Podaci Državnog zavoda za statistiku su iz 2021. godine. Objavljeni su na mreži.",
    "Vanjske poveznice",
    "Službena stranica grada ima mnogo podataka. Stranica je na hrvatskom.",
])


@pytest.mark.parametrize("splitter", ["blingfire", "regex"])
def test_a_croatian_article_loses_its_closing_sections_with_hr_only(splitter):
    body = ["Sava je rijeka u jugoistočnoj Europi.", "Teče kroz Sloveniju, Hrvatsku i Srbiju.",
            "Izvire u Julijskim Alpama.", "Ulijeva se u Dunav kod Beograda."]
    assert clean_article(ARTICLE, splitter, stop_rule("hr")) == body
    kept = clean_article(ARTICLE, splitter, stop_rule("en"))
    assert kept[:4] == body and "Objavljeni su na mreži." in kept and "Stranica je na hrvatskom." in kept
    assert clean_article(ARTICLE, splitter) == kept  # English's headings by default


def test_stop_rules_per_language_and_given():
    assert stop_rule() is stop_rule("en") is TACL and TACL.headings == STOP_PREFIXES
    assert {"Izvori", "Vanjske poveznice", "Kategorija:"} <= set(STOP_HEADINGS["hr"])
    assert {"Референце", "Спољашње везе", "Категорија:"} <= set(STOP_HEADINGS["sr"])
    es = stop_rule("es", ["Referencias", "Enlaces externos"])
    assert es.headings == ("Referencias", "Enlaces externos") and es.joiners == ("y", "e")
    assert stop_rule("hr", ["Izvori"]).headings == ("Izvori",)  # given: in place of the language's list
    assert stop_rule("hr", list(reversed(STOP_PREFIXES))) is TACL  # English's, in any order: TaCL's rule
    with pytest.raises(InputError, match=r"^data\.language: 'es' has no built-in stop headings .*data\.stop_headings "):
        stop_rule("es")


def test_english_keeps_the_clean_jobs_settings_as_they_were(tmp_path):
    """English's headings add nothing to the clean job's record or parameters (no rerun of English results);
    another language's are recorded, and one with no headings built in is one line naming the key."""
    from snakemake.utils import validate

    from tacl.experiment.config import SCHEMA, load_schema, plan_errors
    from tacl.experiment.design import clean_language_given, clean_options

    before = {"max_lines", "heldout_fraction", "sentence_splitter", "version"}
    assert set(clean_given(100, 0.01, "blingfire")) == set(clean_given(100, 0.01, "blingfire", stop_rule("en")))
    assert set(clean_given(100, 0.01, "blingfire")) == before
    assert clean_given(100, 0.01, "blingfire", stop_rule("hr"))["stop_headings"] == list(STOP_HEADINGS["hr"])

    config = demo_config(tmp_path)
    validate(config, str(SCHEMA), set_default=True)  # the schema's defaults, as the Snakefile fills them in
    assert config["data"]["language"] == "en" and config["data"]["stop_headings"] is None
    assert clean_language_given(config) == {} and clean_options(config) == ""
    config["data"]["stop_headings"] = list(STOP_PREFIXES)  # English's, given: the same settings
    assert clean_language_given(config) == {} and clean_options(config) == ""
    config["data"].update(language="hr", stop_headings=None)
    assert clean_language_given(config) == {"stop_headings": list(STOP_HEADINGS["hr"]), "stop_joiners": ["i", "te"],
                                            "stop_match": STOP_MATCH}
    assert clean_options(config).startswith(" --stop-headings '[\"Izvori\", ")
    assert clean_options(config).endswith(" --stop-joiners '[\"i\", \"te\"]'")
    assert not [p for p in plan_errors(config, load_schema(SCHEMA)) if p.startswith("data.")]
    config["data"]["language"] = "es"
    assert [p for p in plan_errors(config, load_schema(SCHEMA)) if p.startswith("data.")] == [
        "data.language: 'es' has no built-in stop headings (en, hr, sr); give its closing sections' headings as "
        "data.stop_headings (`tacl data headings` counts them in a corpus)"]


ENGLISH_DOCS = [["The river flows through the old town.", "Its water is cold in the spring."],
                ["The town has a small market.", "People sell fish and bread there."]]
SERBIAN_DOCS = [["Београд је главни град Србије.", "Налази се на ушћу Саве у Дунав."],
                ["Нови Сад лежи на Дунаву.", "То је други град по величини."]]


@pytest.mark.parametrize("kind", ["wordpiece", "unigram", "bpe"])
def test_a_tokenizer_without_the_corpus_script_shows_a_high_unknown_share(kind, tmp_path):
    """A tokenizer trained on English text leaves Cyrillic unknown: the shard entries count the unknown token
    among the tokens written, the manifest and the data summary add them up (its examples named by the shards'
    form), and the summary warns naming the tokenizer and the `tokenizer` and `model` keys. Byte-level BPE has
    no unknown token (it covers every byte)."""
    from test_shards import write_corpus
    from tokenizer_kit import train

    from tacl.cluster.hooks import data_summary
    from tacl.data.build import build_shard, gather_shards, unknown_line
    from tacl.data.download import fetch_tokenizer
    from tacl.runtime.io import write_json_atomic

    texts = [" ".join(d) for d in ENGLISH_DOCS] * 20
    tok = fetch_tokenizer(str(train(kind, texts, tmp_path / "trained", vocab_size=200)), str(tmp_path / "tok"),
                          family="bert" if kind == "wordpiece" else "roberta")
    shares = {}
    for name, docs in (("en", ENGLISH_DOCS), ("sr", SERBIAN_DOCS)):
        folder = tmp_path / name
        folder.mkdir()
        corpus, index = write_corpus(folder, docs)
        entry = build_shard(corpus, index, tok, 0, 1, 64, 0.0, 1, str(folder / "shard-00000.bin"),
                            str(folder / "shard-00000.json"))
        manifest = gather_shards([str(folder / "shard-00000.json")], str(folder / "manifest.json"))
        assert manifest["totals"]["unk_tokens"] == entry["unk_tokens"]
        shares[name] = entry["unk_tokens"] / entry["tokens"]
        summary = {"documents": 2, "sentences": 4, "examples": entry["examples"], "tokens": entry["tokens"],
                   "shards": 1, "unk_tokens": entry["unk_tokens"], "tokenizer": manifest["tokenizer"]["name"]}
        write_json_atomic(folder / "summary.json", summary)
        shown = data_summary(str(folder / "summary.json"), str(folder / "manifest.json"), "results").split("\n")
        assert shown[0].endswith(f" tokens ({shares[name]:.2%} unknown) in 1 shards")
        what = "NSP examples" if kind == "wordpiece" else "sequences of whole sentences"  # (the shards' form)
        assert f" sentences, {entry['examples']} {what}, " in shown[0], shown[0]
        warning = unknown_line(entry["unk_tokens"], entry["tokens"], summary["tokenizer"])
        assert shown[1:] == ([warning] if shares[name] > 0.01 else []) and (warning is None) == (shares[name] <= 0.01)
    assert shares["en"] == 0
    if kind == "bpe":
        assert shares["sr"] == 0
        return
    assert shares["sr"] > 0.3  # (the special tokens around each example are known)
    assert unknown_line(1, 100, "t") is None and unknown_line(None, 100, "t") is None
    assert unknown_line(2, 100, "t") == (
        "warning: 2.0% of the shards' tokens (2 of 100) are the unknown token of the tokenizer 't', which does not "
        "cover the corpus's language: give one that does as `tokenizer` (or a start model for the language as "
        "`model`)")
