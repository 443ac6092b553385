from tacl.data.clean import clean_article, clean_corpus, is_heldout, read_documents
from tacl.data.sources import read_wikiextractor
from tacl.runtime.io import InputError, write_json_atomic

import numpy as np
import pytest


def test_stop_sections_short_paragraphs_and_sentences():
    text = "\n".join([
        "History.",                                   # heading: 1 word, dropped
        "The town was founded in 1820. It grew quickly. Ok.",
        "Two words",                                  # under 3 words, dropped
        "A third paragraph has enough words here. Hi",
        "See also",                                   # stop: nothing after this is kept
        "This paragraph comes after the stop line and must not appear.",
    ])
    assert clean_article(text) == [
        "The town was founded in 1820.",
        "It grew quickly.",
        "Ok.",
        "A third paragraph has enough words here.",
    ]


@pytest.mark.parametrize("stop", ["References", "External links", "Category:Towns", "See also"])
def test_every_stop_prefix(stop):
    text = f"First sentence is here. Second one too.\n{stop}\nLater text should never be kept. Never."
    assert clean_article(text) == ["First sentence is here.", "Second one too."]


def test_short_documents_are_dropped():
    assert clean_article("Only one sentence survives here.") == []
    assert clean_article("Tiny.\nToo short\nOne real sentence is here.") == []
    assert clean_article("References first line\nAnything after is gone. Gone here.") == []


def test_sentences_under_three_characters_are_dropped():
    expected = ["This is fine.", "It is fine too.", "Hi!", "Yes."]
    assert clean_article("This is fine. A? It is fine too. Hi! Yes.") == expected


def test_heldout_is_stable_and_proportional():
    ids = [str(i) for i in range(20000)]
    chosen = [i for i in ids if is_heldout(i, 0.1)]
    assert 0.09 < len(chosen) / len(ids) < 0.11
    assert chosen == [i for i in ids if is_heldout(i, 0.1)]
    assert not any(is_heldout(i, 0.0) for i in ids[:100])


def _wikiextractor(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for i, (title, body) in enumerate(docs):
            f.write(f'<doc id="{i}" url="?curid={i}" title="{title}">\n{title}\n\n{body}\n</doc>\n')


def test_clean_corpus_end_to_end(tmp_path):
    docs = [(f"Title number {i}", f"Sentence one of doc {i} is here. Sentence two of doc {i} is here.\n"
             f"Another paragraph of doc {i} with words.") for i in range(50)]
    _wikiextractor(tmp_path / "wiki_00", docs)
    arts = list(read_wikiextractor([tmp_path / "wiki_00"]))
    assert arts[3].title == "Title number 3" and not arts[3].text.startswith("Title")
    write_json_atomic(tmp_path / "raw.json", {"source": {"kind": "wikiextractor",
                                                         "paths": [str(tmp_path / "wiki_*")]}})
    out = {k: str(tmp_path / k) for k in ("corpus.txt", "idx.npy", "heldout.txt", "stats.json")}
    stats = clean_corpus(str(tmp_path / "raw.json"), out["corpus.txt"], out["idx.npy"], out["heldout.txt"],
                         out["stats.json"], max_lines=None, heldout_fraction=0.2, workers=2, progress=False)
    assert stats["documents"] + stats["heldout_documents"] == 50
    assert stats["heldout_documents"] > 0
    lines = open(out["corpus.txt"]).read().split("\n")
    assert len(lines) - 1 == stats["lines"] == stats["sentences"] + stats["documents"]
    docs_back = read_documents(out["corpus.txt"], out["idx.npy"], 0, stats["documents"])
    assert all(len(d) == 3 for d in docs_back)
    assert docs_back[1] == read_documents(out["corpus.txt"], out["idx.npy"], 1, 2)[0]
    # the cap stops before the first document that would cross it
    capped = clean_corpus(str(tmp_path / "raw.json"), out["corpus.txt"], out["idx.npy"], out["heldout.txt"],
                          out["stats.json"], max_lines=10, heldout_fraction=0.0, workers=1, progress=False)
    assert capped["capped"] and capped["lines"] == 8 and capped["documents"] == 2
    assert len(np.load(out["idx.npy"])) == 3


def test_empty_corpus_fails_naming_the_file(tmp_path):
    (tmp_path / "wiki_00").write_text('<doc id="1" url="x" title="T">\nT\n\nShort.\n</doc>\n')
    write_json_atomic(tmp_path / "raw.json", {"source": {"kind": "wikiextractor",
                                                         "paths": [str(tmp_path / "wiki_00")]}})
    with pytest.raises(InputError, match="raw.json.*0 document"):
        clean_corpus(str(tmp_path / "raw.json"), *(str(tmp_path / n) for n in ("c", "i.npy", "h", "s.json")))
    assert not (tmp_path / "c").exists(), "a failed clean must not leave a corpus behind"


# -- the reference's regular-expression splitter (data.sentence_splitter: regex), one rule per test ------------

from tacl.data.clean import split_like_reference  # noqa: E402


def test_regex_drops_text_after_the_last_terminator():
    assert split_like_reference("It rained. Then it stopped") == ["It rained."]
    assert split_like_reference("Early life and career") == []  # a heading has no terminator: gone
    assert split_like_reference("Why? Because! Yes.") == ["Why?", "Because!", "Yes."]


def test_regex_splits_decimals_and_protects_titles_suffixes_initials():
    assert split_like_reference("It grew 10.4 percent in a year.") == ["It grew 10.", "4 percent in a year."]
    assert split_like_reference("Mr. Smith met Dr. Jones in St. Louis.") == ["Mr. Smith met Dr. Jones in St. Louis."]
    assert split_like_reference("Acme Inc. makes tools. John Smith Jr. sells them.") == [
        "Acme Inc. makes tools.", "John Smith Jr. sells them."]
    assert split_like_reference("The poet T. S. Eliot wrote it. It sold.") == ["The poet T. S. Eliot wrote it.",
                                                                           "It sold."]


def test_regex_acronyms_domains_and_phd():
    assert split_like_reference("She moved to the U.S.A. in 1990. It was cold.") == [
        "She moved to the U.S.A. in 1990.", "It was cold."]
    assert split_like_reference("He left the U.S. He never came back.") == [
        "He left the U.S.", "He never came back."], "an acronym before a sentence starter ends the sentence"
    # a suffix before a sentence starter ends the sentence, and the reference's rule drops that dot
    assert split_like_reference("Acme Inc. However the rest failed.") == ["Acme Inc", "However the rest failed."]
    assert split_like_reference("See example.com for details. She has a Ph.D. in maths.") == [
        "See example.com for details.", "She has a Ph.D. in maths."]


def test_regex_moves_closing_quotes_before_the_terminator():
    assert split_like_reference('He said "stop." Then he left.') == ['He said "stop".', "Then he left."]
    assert split_like_reference("She wrote \u201cno.\u201d It ended.") == ["She wrote \u201cno\u201d.", "It ended."]
    assert split_like_reference('"Why?" he asked.') == ['"Why"?', "he asked."]


def test_regex_cleaning_keeps_a_stop_line_of_three_words_or_more():
    text = "\n".join(["The town was founded in 1820. It grew quickly.",
                      "See also the list of towns.",  # the stop line: kept by the reference (3+ words), then stop
                      "Never kept after the stop line."])
    assert clean_article(text, "regex") == ["The town was founded in 1820.", "It grew quickly.",
                                            "See also the list of towns."]
    assert clean_article(text) == ["The town was founded in 1820.", "It grew quickly."]  # blingfire: dropped
    short_stop = "One sentence is here. Two sentences now.\nSee also\nNot kept. Not kept."
    assert clean_article(short_stop, "regex") == ["One sentence is here.", "Two sentences now."]
    with pytest.raises(InputError, match="data.sentence_splitter: 'nltk' is not one of blingfire, regex"):
        clean_article(text, "nltk")
