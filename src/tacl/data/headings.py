"""The headings of the sections that close a Wikipedia article (references, external links, see also), where
the clean step stops an article: each language's list, the one rule by which a line stops an article, both
scripts of a Wikipedia that serves two, and `tacl data headings`, which counts the headings that close the
articles of a corpus, so that a language's list can be read off the user's own data.

The stop rule (`StopRule.stops_at`), for every list but English's: a line stops the article when
- it is a listed heading itself, a closing '.' or ':' aside ("Izvori", "Izvor.", WikiExtractor's heading
  lines end in '.'); or
- it starts with a listed heading that ends in ':' (a category line: "Kategorija:Rijeke u Hrvatskoj"); or
- it is a compound heading: a heading line (at most MAX_HEADING_WORDS words, no '.', '!', '?', ';' or ':'
  inside) that starts with a listed heading, followed by ',', '&', '/' or the language's word for "and"
  (CONJUNCTIONS): "Izvori i literatura", "Bilješke i izvori", "Referencias y notas", "Notes, citations and
  references".
A paragraph that merely begins with the same word goes on: it is longer, holds a sentence's punctuation, or
goes on without a conjunction ("Izvori Save nalaze se u Julijskim Alpama.", "Literatura je umjetnost riječi.",
"Sources of emissions."). English's built-in list is TaCL's recipe and keeps the reference's own rule: a line
that starts with one of its headings.

Why these bounds, from real WikiExtractor output (English Wikipedia, 32 files, 169,259 lines): every compound
closing heading there has 3 or 4 words, joined by "and" or a comma ("Citations and references.", "Notes,
citations, and references.", "References and sources.", "Notes and citations."), while the lines that begin
with such a word and go on otherwise are body text ("Sources of emissions.", "Literature for the blind.",
"Bibliography of Bill Clinton", "References to the Toronto Maple Leafs have been made ..."). With a
ten-heading English list (References, Notes, Sources, Bibliography, Citations, Literature, Further reading,
External links, See also, Footnotes) the rule stops at 40 compound closing lines there, and at 3 short body
headings joined the same way ("Literature and theater.", "Sources, sinks and conversion of energy.",
"Citations and review.").

The built-in lists (see STOP_HEADINGS for where each heading was read) hold the singular and the plural form
of a heading that has both, since a section of one item takes the singular ("Izvor" closes the Croatian
article on the municipality of Grocka, whose one source is a census table).

Serbian Wikipedia keeps each article in the script its author wrote it in, Cyrillic or Latin, and converts
only when it shows it; Serbo-Croatian Wikipedia serves both scripts too (its edit links read "uredi -
уреди"). For these languages (TWO_SCRIPTS) every heading and conjunction is matched in both scripts: the list
is written once and its other form made by the Serbian transliteration (`to_latin`, `to_cyrillic`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from tacl.data.sources import Article, iter_articles
from tacl.runtime.io import InputError, read_json

# TaCL's recipe (English Wikipedia): an article stops at the first line that starts with one of these.
STOP_PREFIXES = ("References", "External links", "Category:", "See also")

# The headings of the sections that close an article, per Wikipedia language (`data.language`), each in its
# singular and plural form where it has both. Where they were read (stored public copies):
# - hr: the article "Grocka (općina)" of enciklopedija.cc (a Croatian wiki of hr.wikipedia's articles) closes
#   with "Izvor" (its one source, a census table) and "Vanjske poveznice"; the MDWiki translation bot's
#   Croatian rule renames "Reference", left by translations from English, to "Izvori"; a Slovene pretraining
#   pipeline cuts Croatian Wikipedia at "Vidi još", "Vanjske poveznice", "Izvori"; a table of Wikipedia's
#   reference sections per language gives "Bilješke", "Reference", "Literatura", "Vanjske poveznice".
# - sr: the article "Lua (programski jezik)" of sr.wikipedia.org is written in Latin under the Cyrillic
#   interface; a Serbian Wikipedia scraper stops at "Види још", "Референце", "Напомене", "Извори" and, on Latin
#   articles, "Reference", "Spoljašnje veze"; a Serbian Latin pretraining pipeline at "Vidi još", "Spoljašnje
#   veze", "Reference"; the same table gives "Напомене", "Референце", "Литература", "Спољашње везе".
# The category lines ("Kategorija:", "Категорија:") are the wikis' namespace names. A language missing here is
# given as `data.stop_headings` (`tacl data headings` counts its headings in a corpus).
STOP_HEADINGS: dict[str, tuple[str, ...]] = {
    "en": STOP_PREFIXES,
    "hr": ("Izvori", "Vanjske poveznice", "Izvor", "Vanjska poveznica", "Literatura", "Bilješke", "Bilješka",
           "Reference", "Referenca", "Povezani članci", "Povezani članak", "Vidi još",
           "Kategorija:", "Kategorije:"),
    "sr": ("Референце", "Референца", "Спољашње везе", "Спољашња веза", "Литература", "Извори", "Извор",
           "Види још", "Напомене", "Напомена", "Категорија:", "Категорије:"),  # (and each in Latin)
}

# The languages whose Wikipedia serves an article in either of two scripts (Serbian Cyrillic and Latin):
# headings and conjunctions are matched in both.
TWO_SCRIPTS = ("sr", "sh")

# The word for "and" that joins two headings into one ("Izvori i literatura"), per language; a language
# missing here joins by ',', '&' and '/' only.
CONJUNCTIONS: dict[str, tuple[str, ...]] = {
    "en": ("and",), "de": ("und",), "fr": ("et",), "es": ("y", "e"), "it": ("e", "ed"), "pt": ("e",),
    "ca": ("i",), "gl": ("e",), "nl": ("en",), "sv": ("och",), "da": ("og",), "no": ("og",), "nb": ("og",),
    "nn": ("og",), "fi": ("ja",), "et": ("ja",), "hu": ("és",), "pl": ("i", "oraz"), "cs": ("a", "i"),
    "sk": ("a", "i"), "sl": ("in",), "hr": ("i", "te"), "bs": ("i", "te"), "sr": ("и",), "sh": ("i", "te"),
    "mk": ("и",), "bg": ("и",), "ru": ("и",), "uk": ("і", "й", "та"), "be": ("і",), "ro": ("și", "şi"),
    "lt": ("ir",), "lv": ("un",), "tr": ("ve",), "id": ("dan",), "ms": ("dan",), "vi": ("và",), "eo": ("kaj",),
    "eu": ("eta",), "el": ("και",),
}

MAX_HEADING_WORDS = 6  # a heading line's length at most, in words
_SENTENCE_MARKS = frozenset(".!?;:")
_JOIN_MARKS = (",", "&", "/")

# How a line matches the stop headings where they are not English's: recorded beside them (a change of the
# rule changes the clean job's settings, so that its corpus is made again)
STOP_MATCH = "heading line or compound heading"

# -- Serbian Cyrillic <-> Latin ---------------------------------------------------------------------------------
_LATIN = dict(zip("АБВГДЂЕЖЗИЈКЛЉМНЊОПРСТЋУФХЦЧЏШ",
                  "A B V G D Đ E Ž Z I J K L Lj M N Nj O P R S T Ć U F H C Č Dž Š".split()))
_LATIN.update({c.lower(): latin.lower() for c, latin in list(_LATIN.items())})
_CYRILLIC = {latin: c for c, latin in _LATIN.items()}
_CYRILLIC.update({latin.upper(): c for c, latin in _LATIN.items() if len(latin) == 2 and c.isupper()})
_LATIN_LETTER = re.compile("|".join(sorted(map(re.escape, _CYRILLIC), key=len, reverse=True)))


def to_latin(text: str) -> str:
    """Serbian Cyrillic text in Serbian Latin script (exact: one Latin letter or digraph per Cyrillic letter;
    Љ, Њ and Џ are "LJ", "NJ", "DŽ" before a capital, else "Lj", "Nj", "Dž")."""
    out = []
    for i, c in enumerate(text):
        latin = _LATIN.get(c, c)
        if len(latin) == 2 and c.isupper() and i + 1 < len(text) and text[i + 1].isupper():
            latin = latin.upper()
        out.append(latin)
    return "".join(out)


def to_cyrillic(text: str) -> str:
    """Serbian Latin text in Serbian Cyrillic script; "lj", "nj" and "dž" are read as one letter (Љ, Њ, Џ),
    which is right but for a few compounds ("nadživeti"), where the Cyrillic form is listed as well."""
    return _LATIN_LETTER.sub(lambda m: _CYRILLIC[m.group()], text)


def both_scripts(words: Iterable[str]) -> tuple[str, ...]:
    """Each word and its form in the other Serbian script, in order, each once."""
    out: dict[str, None] = {}
    for w in words:
        out.update(dict.fromkeys((w, to_latin(w), to_cyrillic(w))))
    return tuple(out)


# -- the stop rule ------------------------------------------------------------------------------------------------


def _core(line: str) -> str:
    """A stripped line without its closing '.' or ':' marks."""
    return line.strip().rstrip(" :.")


def heading_line(line: str) -> bool:
    """Whether a line is shaped like a heading: at most MAX_HEADING_WORDS words, starting with a letter that is
    not lower case, with no sentence mark inside ('.', '!', '?', ';', ':'; a closing one aside)."""
    core = _core(line)
    return (bool(core) and len(core.split()) <= MAX_HEADING_WORDS and core[0].isalpha() and not core[0].islower()
            and not _SENTENCE_MARKS.intersection(core))


@dataclass(frozen=True)
class StopRule:
    """The stop headings of the clean step and the words that join two of them (see the module docstring)."""

    headings: tuple[str, ...]
    joiners: tuple[str, ...] = ()
    _joiners: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_joiners", frozenset(j.casefold() for j in self.joiners))

    @property
    def reference(self) -> bool:
        """Whether these are TaCL's headings (in any order), matched by the reference's rule (a line that starts
        with one)."""
        return sorted(self.headings) == sorted(STOP_PREFIXES)

    def stops_at(self, line: str) -> bool:
        """Whether an article stops at this (stripped) line."""
        if self.reference:
            return line.startswith(self.headings)
        core = _core(line)
        for heading in self.headings:
            if heading.endswith(":"):
                if line.startswith(heading):
                    return True
            elif core.startswith(heading):
                rest = core[len(heading):]
                if not rest:
                    return True
                if not rest[0].isalnum() and self._joined(rest) and heading_line(line):
                    return True
        return False

    def _joined(self, rest: str) -> bool:
        """Whether what follows a heading joins another to it: ',', '&', '/' or a conjunction."""
        rest = rest.lstrip()
        return rest.startswith(_JOIN_MARKS) or (bool(rest) and rest.split(maxsplit=1)[0].casefold() in self._joiners)

    def given(self) -> dict[str, Any]:
        """The rule as the clean and download jobs' records and parameters keep it: nothing for TaCL's headings,
        so that the jobs made before languages were recorded keep their settings (no rerun)."""
        if self.reference:
            return {}
        return {"stop_headings": list(self.headings), "stop_joiners": list(self.joiners), "stop_match": STOP_MATCH}


TACL = StopRule(STOP_PREFIXES)


def stop_rule(language: str = "en", given: list[str] | None = None) -> StopRule:
    """The clean step's stop rule: the headings `given` (data.stop_headings) where given, else the built-in list
    of `language` (data.language), joined by the language's conjunctions, in both scripts where its Wikipedia
    serves two. An empty list stops at no heading (every article is kept whole)."""
    if given is None:
        if language not in STOP_HEADINGS:
            raise InputError(f"data.language: {language!r} has no built-in stop headings "
                             f"({', '.join(STOP_HEADINGS)}); give its closing sections' headings as data.stop_headings "
                             "(`tacl data headings` counts them in a corpus)")
        given = list(STOP_HEADINGS[language])
    headings, joiners = tuple(given), CONJUNCTIONS.get(language, ())
    if StopRule(headings).reference:
        return TACL
    if language in TWO_SCRIPTS:
        headings, joiners = both_scripts(headings), both_scripts(joiners)
    return StopRule(headings, joiners)


def rule_given(headings: list[str] | None, joiners: list[str] | None) -> StopRule:
    """The stop rule a job is given on its command line (`--stop-headings`, `--stop-joiners`, JSON lists);
    TaCL's without them."""
    rule = TACL if headings is None else StopRule(tuple(headings), tuple(joiners or ()))
    return TACL if rule.reference else rule


# -- the headings that close a corpus's articles --------------------------------------------------------------

PROSE_WORDS = 30  # a line of this many words or more is prose (the article's body), not a reference
CLOSING_SHARE = 0.75  # a closing heading closes at least this share of the articles it appears in
_CATEGORY = re.compile(r"([^\W\d_][^\s:/]*):(?!//)\S")  # "Kategorija:Rijeke", not "https://..."


def closing_heading(line: str) -> str | None:
    """The heading a line gives (its closing '.' or ':' aside), the prefix of a category line ("Kategorija:"),
    or None for a line that is no heading."""
    if m := _CATEGORY.match(line):
        return m.group(1) + ":"
    return _core(line) if heading_line(line) else None


@dataclass
class ClosingHeadings:
    """What `closing_headings` counted: articles read, those with a body (a line of prose), and per heading the
    articles with a body it appears in (`seen`) and those it closes (`closes`)."""

    prose_words: int = PROSE_WORDS
    articles: int = 0
    with_body: int = 0
    seen: Counter = field(default_factory=Counter)
    closes: Counter = field(default_factory=Counter)

    def ranked(self, min_share: float = CLOSING_SHARE) -> list[tuple[str, int, int]]:
        """(heading, articles it closes, articles it appears in) for the headings that close at least
        `min_share` of the articles they appear in, the most frequent first (then by name)."""
        rows = [(h, n, self.seen[h]) for h, n in self.closes.items() if n >= min_share * self.seen[h]]
        return sorted(rows, key=lambda row: (-row[1], row[0]))


def closing_headings(articles: Iterable[Article], prose_words: int = PROSE_WORDS,
                     max_articles: int | None = None) -> ClosingHeadings:
    """Count the headings that close the articles. An article's closing headings are the heading lines after
    its last line of prose (a line of `prose_words` words or more), after which it holds only short lines
    (references, links, list items, further headings); articles without prose are left out. Each heading
    counts once per article, where it closes it and where it appears at all: a heading that closes the
    articles it appears in is a closing section's, one that is mostly followed by prose is the body's."""
    found = ClosingHeadings(prose_words)
    for article in articles:
        if max_articles is not None and found.articles >= max_articles:
            break
        found.articles += 1
        lines = [s for line in article.text.split("\n") if (s := line.strip())]
        last = next((i for i in range(len(lines) - 1, -1, -1) if len(lines[i].split()) >= prose_words), None)
        if last is None:
            continue
        found.with_body += 1
        found.seen.update({h for line in lines if (h := closing_heading(line))})
        found.closes.update({h for line in lines[last + 1:] if (h := closing_heading(line))})
    return found


def corpus_headings(raw: str | None = None, source: dict[str, Any] | None = None, cache_dir: str | None = None,
                    prose_words: int = PROSE_WORDS, max_articles: int | None = None) -> ClosingHeadings:
    """`closing_headings` of a corpus as the data stage reads it: the one the download step described (`raw`,
    its raw.json), or a `data.source` (WikiExtractor or text files; a Hugging Face dataset from `cache_dir`)."""
    if raw is not None:
        described = read_json(raw)
        articles = iter_articles(described["source"], described.get("cache_dir"), described.get("rows_file"))
    else:
        articles = iter_articles(source or {}, cache_dir)
    return closing_headings(articles, prose_words, max_articles)


def headings_table(found: ClosingHeadings, top: int = 20, min_share: float = CLOSING_SHARE) -> str:
    """The most frequent closing headings as `tacl data headings` prints them: the articles each closes, the
    articles it appears in, the heading."""
    lines = [f"{found.articles} articles read, {found.with_body} with a body (a line of {found.prose_words}+ words). "
             f"Headings after which an article holds only short lines, in at least {min_share:.0%} of the articles "
             "they appear in, the most frequent first:",
             f"{'closes':>7} {'of':>7}  heading"]
    lines += [f"{n:>7} {seen:>7}  {heading}" for heading, n, seen in found.ranked(min_share)[:top]]
    lines.append("Give those that head closing sections (references, notes, sources, links, see also), singular and "
                 "plural, as data.stop_headings.")
    return "\n".join(lines)
