"""The stop rule (tacl.data.headings): where an article stops, on English, Croatian, Serbian Cyrillic and Serbian
Latin article structure and the schema's Spanish example; compound headings stop, body paragraphs that begin
with a heading's word go on; an empty list; the built-in lists' singular and plural forms; Serbian's two
scripts; and `tacl data headings` on a corpus the test writes."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import yaml

from conftest import REPO
from tacl.data.clean import clean_article
from tacl.data.headings import (CLOSING_SHARE, CONJUNCTIONS, MAX_HEADING_WORDS, PROSE_WORDS, STOP_HEADINGS, TACL,
                                TWO_SCRIPTS, StopRule, closing_headings, headings_table, rule_given, stop_rule,
                                to_cyrillic, to_latin)
from tacl.data.sources import Article

BODY = ("The river rises in the Julian Alps and flows east through three countries. "
        "It joins the Danube at Belgrade after a long course.")


def article(*lines: str) -> str:
    return "\n".join(lines)


def test_english_keeps_the_references_rule():
    """English's built-in list is TaCL's recipe: a line that starts with a heading stops the article, as in the
    reference, a body line that begins with the word too ("References to ..."; two articles of the English
    sample open so). WikiExtractor's heading lines end in '.'."""
    assert stop_rule("en") is TACL
    for line in ("References.", "See also.", "External links", "Category:Rivers", "References and notes.",
                 "References to the team have been made in films."):
        assert TACL.stops_at(line), line
    assert not TACL.stops_at("Notes.") and not TACL.stops_at("Early life.")
    text = article("Danube", BODY, "Course.", BODY, "See also.", "List of rivers of Europe and their basins.",
                   "References.")
    assert clean_article(text, "blingfire", TACL) == clean_article(article(BODY, BODY))


CROATIAN = article(
    "Sava je rijeka u jugoistočnoj Europi. Teče kroz Sloveniju, Hrvatsku, Bosnu i Hercegovinu i Srbiju.",
    "Izvori Save nalaze se u Julijskim Alpama. Dva su izvora, Sava Dolinka i Sava Bohinjka.",
    "Literatura je umjetnost riječi.",
    "Izvor.",
    "Statistički zavod Srbije. Popis stanovništva 2002. godine. Pristupljeno 3. rujna 2009.",
    "Vanjske poveznice.",
    "Službena stranica općine ima mnogo podataka o rijeci.",
)


def test_a_croatian_article_stops_at_its_singular_source_heading_and_keeps_the_body():
    """"Izvor." (a section of one source, WikiExtractor's closing '.') stops the article; the paragraphs that
    begin with "Izvori" (the Sava's springs) and "Literatura" are body text and stay."""
    kept = clean_article(CROATIAN, "blingfire", stop_rule("hr"))
    assert "Izvori Save nalaze se u Julijskim Alpama." in kept and "Literatura je umjetnost riječi." in kept
    assert not [s for s in kept if "Pristupljeno" in s or "Službena" in s]
    assert [s for s in clean_article(CROATIAN, "blingfire", TACL) if "Pristupljeno" in s]  # (English's list: kept)


@pytest.mark.parametrize("heading", ["Izvori i literatura", "Bilješke i izvori", "Izvori i literatura.",
                                     "Literatura i vanjske poveznice", "Izvori, literatura", "Izvori & literatura",
                                     "Izvori te literatura", "Vanjske poveznice i izvori:"])
def test_compound_croatian_headings_stop(heading):
    text = article(BODY, heading, "Statistički zavod Srbije. Pristupljeno 14. ožujka 2011.")
    assert stop_rule("hr").stops_at(heading)
    assert clean_article(text, "blingfire", stop_rule("hr")) == clean_article(BODY)


@pytest.mark.parametrize("line", [
    "Izvori Save nalaze se u Julijskim Alpama. Dva su izvora.",  # the springs, a sentence
    "Literatura je umjetnost riječi.",  # no conjunction after the heading
    "Izvorište rijeke je u planini.",  # a longer word than the heading
    "Izvori i literatura o rijeci Savi i njezinim pritocima",  # more than MAX_HEADING_WORDS words
    "Literatura i umjetnost su važne. Obje su stare.",  # a sentence's punctuation inside
    "Izvor: Državni zavod za statistiku",  # a ':' inside: a source note, not a heading
    "izvori i literatura",  # not the heading (its case)
])
def test_body_lines_that_begin_with_a_heading_word_go_on(line):
    assert not stop_rule("hr").stops_at(line)


SERBIAN = article(
    "Сава је река у југоисточној Европи. Тече кроз Словенију, Хрватску, Босну и Херцеговину и Србију.",
    "Литература је уметност речи.",
    "Напомене.",
    "Према попису из 2002. године. Приступљено 3. септембра 2009.",
    "Референце",
    "Републички завод за статистику Србије. Књига 9. Становништво.",
)


@pytest.mark.parametrize("script", ["cyrillic", "latin"])
def test_a_serbian_article_stops_in_either_script(script):
    """Serbian Wikipedia keeps an article in its author's script: the same article written in Latin stops at
    the same headings as in Cyrillic ("Napomene", "Reference", "Spoljašnje veze"), compounds included."""
    rule = stop_rule("sr")
    text = SERBIAN if script == "cyrillic" else to_latin(SERBIAN)
    kept = clean_article(text, "blingfire", rule)
    assert len(kept) == 3 and kept[2] in ("Литература је уметност речи.", "Literatura je umetnost reči.")
    for line in ("Референце", "Спољашње везе.", "Извор", "Извори и литература", "Категорија:Реке у Србији"):
        assert rule.stops_at(line) and rule.stops_at(to_latin(line)), line
    assert not rule.stops_at("Spoljašnje veze su kratke.") and not rule.stops_at(to_latin("Литература је уметност."))


def test_the_schemas_spanish_example():
    """data.stop_headings' own example, as the schema gives it: "Referencias" stops at "Referencias y notas"
    (a compound joined by Spanish "y") as at "Referencias", and not at a body heading that goes on otherwise."""
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    description = schema["properties"]["data"]["properties"]["stop_headings"]["description"]
    example = yaml.safe_load(re.search(r"e\.g\. (\[[^]]*\])", description).group(1))
    assert example == ["Referencias", "Enlaces externos", "Véase también", "Categoría:"]
    assert "Referencias y notas" in description
    rule = stop_rule("es", example)
    for line in ("Referencias", "Referencias.", "Referencias y notas", "Referencias y notas.", "Enlaces externos",
                 "Véase también", "Categoría:Ríos de España"):
        assert rule.stops_at(line), line
    for line in ("Referencias en la cultura popular", "Referencias a la obra aparecen en varias series de televisión.",
                 "Véanse también los ríos", "Enlaces externos al sitio oficial del museo de la ciudad y de la región"):
        assert not rule.stops_at(line), line


def test_an_empty_list_stops_nowhere():
    """`data.stop_headings: []` means what the schema says: no stop heading, every article kept whole (and the
    clean job records the empty list)."""
    rule = stop_rule("en", [])
    assert rule.headings == () and rule.given()["stop_headings"] == []
    text = article(BODY, "References.", "External links.", BODY)
    assert clean_article(text, "blingfire", rule) == clean_article(article(BODY, BODY))
    assert rule_given([], ["and"]) == rule
    schema = (REPO / "workflow/schemas/config.schema.yaml").read_text()
    assert "[] = none, every\n          article kept whole" in schema


SINGULAR_PLURAL = {
    "hr": [("Izvor", "Izvori"), ("Vanjska poveznica", "Vanjske poveznice"), ("Bilješka", "Bilješke"),
           ("Referenca", "Reference"), ("Povezani članak", "Povezani članci"), ("Kategorija:", "Kategorije:")],
    "sr": [("Референца", "Референце"), ("Спољашња веза", "Спољашње везе"), ("Извор", "Извори"),
           ("Напомена", "Напомене"), ("Категорија:", "Категорије:")],
}


@pytest.mark.parametrize("language", sorted(SINGULAR_PLURAL))
def test_the_built_in_lists_hold_singular_and_plural(language):
    """A closing section of one item takes the singular ("Izvor" above a census table): each built-in heading
    that has both forms is listed in both, and for Serbian in both scripts."""
    rule = stop_rule(language)
    for singular, plural in SINGULAR_PLURAL[language]:
        for heading in (singular, plural):
            assert heading in STOP_HEADINGS[language] and rule.stops_at(heading + "."), heading
            if language in TWO_SCRIPTS:
                assert to_latin(heading) in rule.headings and rule.stops_at(to_latin(heading)), heading
    nouns = {h for pair in SINGULAR_PLURAL[language] for h in pair}
    assert set(STOP_HEADINGS[language]) - nouns <= {"Literatura", "Vidi još", "Литература", "Види још"}


def test_serbian_transliteration_is_exact_both_ways():
    cyrillic = "АБВГДЂЕЖЗИЈКЛЉМНЊОПРСТЋУФХЦЧЏШ"
    latin = "A B V G D Đ E Ž Z I J K L Lj M N Nj O P R S T Ć U F H C Č Dž Š".split()
    for c, lat in zip(cyrillic, latin):  # (one letter at a time: the slow, obvious way)
        assert to_latin(c) == lat and to_latin(c.lower()) == lat.lower() and to_cyrillic(lat) == c
        assert to_cyrillic(lat.lower()) == c.lower()
    for word in ("Спољашње везе", "Љубљана", "ЉУБЉАНА", "Њива", "Џеп", "Ђурђевак", "Категорија:"):
        assert to_cyrillic(to_latin(word)) == word
    assert to_latin("ЉУБЉАНА") == "LJUBLJANA" and to_latin("Љубљана") == "Ljubljana"
    assert to_latin("Спољашње везе") == "Spoljašnje veze"
    assert to_cyrillic("Izvori i literatura") == "Извори и литература"
    assert stop_rule("sh", ["Izvori"]).headings == ("Izvori", "Извори")  # a given list, in the other script too


def _reference_stops(rule: StopRule, line: str) -> bool:
    """The rule written out again with regular expressions, for a comparison line by line."""
    if rule.reference:
        return any(line.startswith(h) for h in rule.headings)
    core = line.strip().rstrip(" :.")
    for h in rule.headings:
        if h.endswith(":"):
            if line.startswith(h):
                return True
            continue
        if core == h:
            return True
        joiners = "|".join(re.escape(j) for j in rule.joiners) or "(?!)"
        compound = re.fullmatch(re.escape(h) + rf"(\s*[,&/]|\s+(?i:{joiners})(\s|$)).*", core)
        short = len(core.split()) <= MAX_HEADING_WORDS and not re.search(r"[.!?;:]", core)
        if compound and short and core[:1].isupper():
            return True
    return False


def test_the_rule_agrees_with_a_slow_reference():
    """Every line built from a heading, a joiner, further words and closing marks is judged alike by the rule
    and by a second writing of it."""
    rule = stop_rule("hr")
    pieces = ["", " i literatura", ", bilješke", " te", " je umjetnost", " Save nalaze se", "ište", " & linkovi",
              " i literatura o Savi i Dunavu i moru", ". Dva su", " I literatura", "/literatura"]
    ends = ["", ".", ":", " .", "!"]
    checked = 0
    for heading, piece, end in itertools.product(("Izvori", "Literatura", "Kategorija:", "Vidi još", "Rijeka"),
                                                 pieces, ends):
        line = heading + piece + end
        assert rule.stops_at(line) == _reference_stops(rule, line), line
        checked += 1
    assert checked == 5 * len(pieces) * len(ends)


def test_the_schema_the_docs_and_the_code_state_one_rule():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    language = " ".join(schema["properties"]["data"]["properties"]["language"]["description"].split())
    docs = " ".join((REPO / "docs/pretraining.md").read_text().split())
    for text in (language, docs):
        assert f"at most {MAX_HEADING_WORDS} words" in text
        assert "no '.', '!', '?', ';' or ':' inside" in text and "',', '&', '/' or the language's" in text
        assert "Cyrillic" in text and "Latin" in text
    assert set(TWO_SCRIPTS) == {"sr", "sh"} and all(CONJUNCTIONS[lang] for lang in STOP_HEADINGS)


def write_wikiextractor(path, articles):
    with open(path, "w", encoding="utf-8") as f:
        for i, (title, lines) in enumerate(articles):
            f.write(f'<doc id="{i}" url="?curid={i}" title="{title}">\n{title}\n\n' + "\n".join(lines) + "\n</doc>\n")


LONG = ("Ovo je dugačak odlomak o rijeci koji ima mnogo riječi kako bi bio proza članka, a ne kratki redak "
        "izvora ili poveznice, pa ga brojač smatra tijelom članka i ne broji naslove prije njega.")


def test_tacl_data_headings_counts_the_closing_headings_of_a_corpus(tmp_path, capsys):
    """On a corpus the test writes: "Izvori" closes three articles (once each, with short source lines after
    it), "Vanjske poveznice" two; "Povijest" heads the body of four articles and closes one, so it is left out;
    an article without prose counts for nothing."""
    assert len(LONG.split()) >= PROSE_WORDS
    corpus = [
        ("A", ["Povijest.", LONG, "Izvori.", "Državni zavod za statistiku. Popis 2011.", "Vanjske poveznice.",
               "https://www.dzs.hr/"]),
        ("B", ["Povijest.", LONG, "Izvori.", "Popis stanovništva. Zagreb, 2001.", "Izvori."]),
        ("C", ["Povijest.", LONG, "Zemljopis.", LONG, "Izvori i literatura.", "Knjiga. Zagreb, 1990.",
               "Vanjske poveznice.", "Kategorija:Rijeke u Hrvatskoj"]),
        ("D", [LONG, "Povijest.", "Kratko.", "Izvori."]),
        ("E", ["Popis.", "Prvi redak", "Drugi redak"]),
    ]
    write_wikiextractor(tmp_path / "wiki_00", corpus)
    found = closing_headings(Article(str(i), t, "\n".join(lines)) for i, (t, lines) in enumerate(corpus))
    assert (found.articles, found.with_body) == (5, 4)
    assert found.closes == {"Izvori": 3, "Vanjske poveznice": 2, "Izvori i literatura": 1, "Kategorija:": 1,
                            "Povijest": 1, "Kratko": 1}
    assert found.seen["Povijest"] == 4 and found.seen["Zemljopis"] == 1 and "Zemljopis" not in found.closes
    assert found.ranked() == [("Izvori", 3, 3), ("Vanjske poveznice", 2, 2), ("Izvori i literatura", 1, 1),
                              ("Kategorija:", 1, 1), ("Kratko", 1, 1)]
    assert closing_headings(Article(str(i), t, "\n".join(x)) for i, (t, x) in enumerate(corpus)).ranked(0.2)[-1] == (
        "Povijest", 1, 4)

    from tacl.cli import main

    source = json.dumps({"kind": "wikiextractor", "paths": [str(tmp_path / "wiki_*")]})
    assert main(["data", "headings", "--source", source, "--top", "2"]) in (0, None)
    printed = capsys.readouterr().out
    assert printed == headings_table(found, 2) + "\n"
    assert printed.splitlines()[2:4] == ["      3       3  Izvori", "      2       2  Vanjske poveznice"]
    from tacl.data.download import download_corpus

    download_corpus(json.loads(source), str(tmp_path / "cache"), str(tmp_path / "raw.json"))  # (the download step's)
    main(["data", "headings", "--raw", str(tmp_path / "raw.json"), "--top", "2"])
    assert capsys.readouterr().out == printed
    main(["data", "headings", "--source", source, "--min-share", "0.2"])
    assert "      1       4  Povijest" in capsys.readouterr().out.splitlines()
    main(["data", "headings", "--source", source, "--min-share", "0.2", "--max-articles", "3"])
    assert "Povijest" not in capsys.readouterr().out  # (A, B, C: it closes none of them)


def test_the_cli_defaults_are_the_functions():
    from tacl.cli import build_parser

    args = build_parser().parse_args(["data", "headings", "--raw", "raw.json"])
    assert (args.prose_words, args.min_share, args.top) == (PROSE_WORDS, CLOSING_SHARE, 20)
