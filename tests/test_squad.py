"""SQuAD: official metrics, threshold search, sliding windows + span decoding round trip, JSON reader."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tacl.finetune.squad import (SquadExample, evaluate, exact_match, f1, normalize_answer, postprocess,
                                 prepare_features, read_squad_json)
from tacl.runtime.io import InputError


def ex(id: str, answers: tuple[str, ...] = (), context: str = "", starts: tuple[int, ...] | None = None,
       question: str = "what?") -> SquadExample:
    if starts is None:
        starts = tuple(context.find(a) for a in answers)
    return SquadExample(id=id, question=question, context=context, answers=answers, answer_starts=starts,
                        is_impossible=not answers)


# ------------------------------------------------------------------------------------------------ metrics


def test_normalize_answer():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theater  Another") == "theater another"  # articles only as whole words
    assert normalize_answer("  A.  ") == ""
    assert normalize_answer("") == ""
    assert normalize_answer("U.S.\tarmy\n") == "us army"


def test_exact_match():
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("", "") == 1.0
    assert exact_match("a", "") == 1.0  # "a" normalizes to ""
    assert exact_match("Paris", "") == 0.0


def test_f1():
    # pred tokens [eiffel, tower, in, paris], gold [eiffel, tower]: 2 common; P = 2/4, R = 2/2, F1 = 2/3
    assert f1("the Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    # pred [new, york, city, new], gold [new, york]: common = min counts -> new 1, york 1 = 2; P = 2/4, R = 1
    assert f1("New York City, new", "new york") == pytest.approx(2 / 3)
    # pred [x, y, z], gold [y, z, w, v]: 2 common; P = 2/3, R = 2/4, F1 = 2*(1/3)/(7/6) = 4/7
    assert f1("x y z", "y z w v") == pytest.approx(4 / 7)
    assert f1("cat", "dog") == 0.0
    assert f1("", "") == 1.0
    assert f1("the", "") == 1.0  # both normalize to ""
    assert f1("", "dog") == 0.0
    assert f1("dog", "") == 0.0


def test_official_edge_cases_of_each_version():
    """v1.1: empty vs empty scores F1 0 (no common token), golds taken as they are; v2.0: empty vs empty
    scores 1, and a question is answerable when its raw gold list is not empty, even if every gold
    normalizes to "" (it is then scored against "")."""
    assert f1("", "", version_2=False) == 0.0 and f1("the", "a", version_2=False) == 0.0
    assert f1("", "") == 1.0 and f1("Paris", "paris", version_2=False) == 1.0
    examples = [ex("q1", ("the",)), ex("q2", ("Paris",))]  # q1's only gold normalizes to ""
    preds = {"q1": "", "q2": "Paris"}
    v1 = evaluate(examples, preds, version_2=False)
    assert v1["exact"] == pytest.approx(100.0)  # EM: "" == "" after normalization, in v1.1 as in v2.0
    assert v1["f1"] == pytest.approx(50.0)  # F1: q1 scores 0 in v1.1
    v2 = evaluate(examples, preds, {"q1": -1.0, "q2": -1.0})
    assert v2["exact"] == v2["f1"] == pytest.approx(100.0)  # q1 scored against [""]: 1
    assert "HasAns_total" not in v2, "both questions are answerable (their raw gold lists are not empty)"
    v2 = evaluate(examples + [ex("q3")], {**preds, "q3": ""}, {"q1": -1.0, "q2": -1.0, "q3": 1.0})
    assert (v2["HasAns_total"], v2["NoAns_total"]) == (2, 1)


def test_evaluate_max_over_golds():
    examples = [ex("q1", ("Eiffel Tower", "the tower", "Eiffel Tower")),
                ex("q2", ("1889", "in 1889")),
                ex("q3", ("red fox",))]
    preds = {"q1": "tower", "q2": "in 1889", "q3": "a blue fox"}
    # q1: EM 0 vs "Eiffel Tower" but 1 vs "the tower" (-> "tower") -> max 1; F1 likewise 2/3 and 1 -> 1
    # q2: EM 1 (second gold), F1 1
    # q3: EM 0; F1 [blue, fox] vs [red, fox]: P 1/2, R 1/2 -> 1/2
    out = evaluate(examples, preds)
    assert out["exact"] == pytest.approx(100 * 2 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + 1 + 0.5) / 3)
    assert out["total"] == 3
    assert "HasAns_exact" not in out and "best_exact" not in out
    with pytest.raises(ValueError, match="no prediction"):
        evaluate(examples, {"q1": "x"})


def test_evaluate_v2_threshold():
    examples = [ex("a1", ("Paris",)), ex("a2", ("blue whale",)), ex("a3", ("1066",)),
                ex("n1"), ex("n2"), ex("n3")]
    preds = {"a1": "Paris", "a2": "whale", "a3": "1067", "n1": "London", "n2": "", "n3": "cats"}
    odds = {"a1": -3.0, "a2": -1.0, "a3": 2.0, "n1": -2.0, "n2": 0.5, "n3": 1.0}
    # Raw (EM, F1) per question: a1 (1, 1), a2 (0, 2/3), a3 (0, 0), n1 (0, 0), n2 (1, 1), n3 (0, 0).
    # Threshold 0.0: a3 (2.0), n2 (0.5), n3 (1.0) become "": a3 (0, 0), n2 (1, 1), n3 (1, 1); n1 (-2.0)
    # keeps "London" (0, 0). EM = a1 1 + n2 1 + n3 1 = 3/6; F1 = 1 + 2/3 + 1 + 1 = 11/3 over 6;
    # HasAns EM 1/3, F1 (1 + 2/3) / 3; NoAns EM = F1 = 2/3.
    out = evaluate(examples, preds, odds)
    assert out["exact"] == pytest.approx(50.0)
    assert out["f1"] == pytest.approx(100 * (11 / 3) / 6)
    assert (out["HasAns_total"], out["NoAns_total"]) == (3, 3)
    assert out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["HasAns_f1"] == pytest.approx(100 * (5 / 3) / 3)
    assert out["NoAns_exact"] == pytest.approx(200 / 3) and out["NoAns_f1"] == pytest.approx(200 / 3)
    # Sweep, in increasing odds: a1 -3, n1 -2, a2 -1, n2 0.5, n3 1, a3 2; start = 3 (all "").
    #   EM: a1 +1 -> 4 (best, thresh -3); n1 -1 -> 3; a2 +0 -> 3; n2 0 -> 3; n3 -1 -> 2; a3 0 -> 2.
    #   F1: a1 +1 -> 4 (best, -3); n1 -1 -> 3; a2 +2/3 -> 11/3; n2 0; n3 -1 -> 8/3; a3 0.
    assert out["best_exact"] == pytest.approx(100 * 4 / 6) and out["best_exact_thresh"] == -3.0
    assert out["best_f1"] == pytest.approx(100 * 4 / 6) and out["best_f1_thresh"] == -3.0
    # The tuned threshold reproduces the best score.
    again = evaluate(examples, preds, odds, threshold=out["best_exact_thresh"])
    assert again["exact"] == pytest.approx(out["best_exact"])
    # A threshold above every odds keeps all raw predictions: EM 2/6.
    assert evaluate(examples, preds, odds, threshold=10.0)["exact"] == pytest.approx(100 * 2 / 6)


def test_best_threshold_official_start():
    # Nothing beats predicting "" everywhere: best = #unanswerable / n, threshold stays at 0.0.
    examples = [ex("a", ("x",)), ex("n1"), ex("n2")]
    out = evaluate(examples, {"a": "y", "n1": "z", "n2": "w"}, {"a": -1.0, "n1": 1.0, "n2": 2.0})
    assert out["best_exact"] == pytest.approx(100 * 2 / 3) and out["best_exact_thresh"] == 0.0


# ------------------------------------------------------------------------------------------------ windows

LONG = ("The river Severn is the longest river in Great Britain . It rises in the Cambrian Mountains of "
        "mid Wales and flows through Shropshire , Worcestershire and Gloucestershire . Its tributaries "
        "include the Vyrnwy , the Teme and the Avon . The estuary is known for its large tidal range , "
        "one of the highest in the world , and for the Severn bore , a tidal wave that travels upstream . "
        "Two road bridges cross the estuary : the Severn Bridge opened in 1966 and the Prince of Wales "
        "Bridge opened in 1996 . A railway tunnel beneath the estuary was completed in 1886 .")
SHORT = "Ada Lovelace wrote the first published algorithm for Charles Babbage's Analytical Engine."


def round_trip_examples() -> list[SquadExample]:
    return [
        ex("s1", ("Cambrian Mountains",), LONG, question="Where does the Severn rise?"),
        ex("s2", ("1886",), LONG, question="When was the railway tunnel completed?"),
        ex("s3", ("Prince of Wales Bridge",), LONG, question="Which bridge opened in 1996?"),
        ex("s4", ("The river Severn",), LONG, question="What is the longest river in Great Britain?"),
        ex("s5", ("Analytical Engine",), SHORT, question="For which machine did Ada Lovelace write?"),
        ex("s6", ("Ada Lovelace",), SHORT, question="Who wrote the first published algorithm?"),
        ex("s7", (), SHORT, question="Where was Babbage born?"),
    ]


@pytest.fixture(scope="module")
def windows(tokenizer):
    examples = round_trip_examples()
    return examples, prepare_features(examples, tokenizer, max_len=64, doc_stride=16, max_query_len=16)


def test_windows_shape_and_overlap(windows):
    examples, feats = windows
    n = len(feats.input_ids)
    for name in ("token_type_ids", "attention_mask", "example_index", "offsets", "start_positions",
                 "end_positions"):
        assert len(getattr(feats, name)) == n
    # unpadded: each window as long as its tokens (a batch is padded to its own longest row), at most max_len
    for w in range(n):
        assert len(feats.input_ids[w]) == len(feats.token_type_ids[w]) == len(feats.offsets[w]) <= 64
        assert feats.attention_mask[w] == [1] * len(feats.input_ids[w]) and feats.input_ids[w][-1] == 102
    assert all(len(feats.input_ids[feats.example_index.index(k)]) == 64 for k in range(4))  # LONG: full
    assert feats.example_index == sorted(feats.example_index)
    counts = np.bincount(feats.example_index)
    assert all(counts[:4] >= 3) and all(counts[4:] == 1)  # LONG needs several windows, SHORT one
    for w in range(n):
        offs, k = feats.offsets[w], feats.example_index[w]
        assert offs[0] is None and feats.input_ids[w][0] == 101  # [CLS]
        for o in offs:
            if o is not None:
                assert 0 <= o[0] < o[1] <= len(examples[k].context)
    for w in range(n - 1):  # consecutive windows of one context share exactly doc_stride tokens
        if feats.example_index[w] != feats.example_index[w + 1]:
            continue
        a = [o for o in feats.offsets[w] if o is not None]
        b = [o for o in feats.offsets[w + 1] if o is not None]
        assert a[-16:] == b[:16] and a[-17] != b[0]
    # the whole context is covered, from its first to its last token
    first = [w for w in range(n) if feats.example_index[w] == 0]
    ctx = [o for o in feats.offsets[first[0]] if o is not None]
    assert ctx[0][0] == 0
    assert [o for o in feats.offsets[first[-1]] if o is not None][-1][1] == len(LONG)


def test_question_truncated(tokenizer):
    q = " ".join(["question"] * 40)
    feats = prepare_features([ex("q", ("Ada",), SHORT, question=q)], tokenizer, max_len=64, doc_stride=8,
                             max_query_len=10)
    # [CLS] + 10 question tokens + [SEP], then the context
    assert feats.offsets[0][:12] == [None] * 12 and feats.offsets[0][12] is not None
    assert feats.input_ids[0][11] == 102
    assert (feats.start_positions[0], feats.end_positions[0]) == (12, 12)


def test_train_targets_and_round_trip(windows):
    examples, feats = windows
    n = len(feats.input_ids)
    inside_per_example = np.zeros(len(examples), dtype=int)
    for w in range(n):
        ex_ = examples[feats.example_index[w]]
        s, e = feats.start_positions[w], feats.end_positions[w]
        ctx = [o for o in feats.offsets[w] if o is not None]
        if ex_.answers:
            a0 = ex_.answer_starts[0]
            a1 = a0 + len(ex_.answers[0])
            inside = ctx[0][0] <= a0 and a1 <= ctx[-1][1]
        else:
            inside = False
        if not inside:
            assert (s, e) == (0, 0)
            continue
        inside_per_example[feats.example_index[w]] += 1
        assert 0 < s <= e and feats.offsets[w][s][0] == a0 and feats.offsets[w][e][1] == a1
        start_logits = np.zeros((n, 64), dtype=np.float32)
        end_logits = np.zeros((n, 64), dtype=np.float32)
        start_logits[w, s] = 10.0
        end_logits[w, e] = 10.0
        for version_2 in (False, True):
            preds, odds = postprocess(examples, feats, start_logits, end_logits, version_2=version_2)
            assert preds[ex_.id] == ex_.answers[0]  # raw text, not only after normalization
            assert odds[ex_.id] == pytest.approx(-20.0)
    assert all(inside_per_example[:6] >= 1) and inside_per_example[6] == 0


def test_eval_features_have_no_targets(tokenizer):
    feats = prepare_features(round_trip_examples(), tokenizer, max_len=64, doc_stride=16, max_query_len=16,
                             train=False)
    assert set(feats.start_positions) == {0} and set(feats.end_positions) == {0}


def test_postprocess_limits_and_null(windows):
    examples, feats = windows
    n = len(feats.input_ids)
    rng = np.random.default_rng(0)
    start_logits, end_logits = rng.normal(size=(2, n, 64))
    preds, odds = postprocess(examples, feats, start_logits, end_logits, n_best=5, max_answer_len=4)
    for k, ex_ in enumerate(examples):
        assert preds[ex_.id] and preds[ex_.id] in ex_.context
        assert len(preds[ex_.id].split()) <= 4
        ws = [w for w in range(n) if feats.example_index[w] == k]
        null = min(start_logits[w, 0] + end_logits[w, 0] for w in ws)
        assert null - odds[ex_.id] <= max(start_logits[w].max() + end_logits[w].max() for w in ws)
    # n_best=1 with the best end before the best start: v2.0 finds no span (""), v1.1 falls back to one.
    k = 4  # SHORT: a single window
    w = feats.example_index.index(k)
    ctx = [i for i, o in enumerate(feats.offsets[w]) if o is not None]
    start_logits = np.zeros((n, 64))
    end_logits = np.zeros((n, 64))
    start_logits[w, 0] = end_logits[w, 0] = 1.0  # null score 2
    start_logits[w, ctx[-1]] = 5.0
    end_logits[w, ctx[0]] = 5.0
    p2, o2 = postprocess(examples, feats, start_logits, end_logits, n_best=1, version_2=True)
    assert p2[examples[k].id] == "" and o2[examples[k].id] == float("inf")
    p1, o1 = postprocess(examples, feats, start_logits, end_logits, n_best=1, version_2=False)
    assert p1[examples[k].id] != "" and o1[examples[k].id] == pytest.approx(2.0 - 5.0)


# ------------------------------------------------------------------------------------------------ reading


def test_read_squad_json_v2(tmp_path):
    data = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [
        {"context": "Ada Lovelace wrote notes.", "qas": [
            {"id": "1", "question": "Who wrote notes?", "is_impossible": False,
             "answers": [{"text": "Ada Lovelace", "answer_start": 0},
                         {"text": "Lovelace", "answer_start": 4}]},
            {"id": "2", "question": "Who read them?", "is_impossible": True, "answers": [],
             "plausible_answers": [{"text": "Ada", "answer_start": 0}]}]}]}]}
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(data))
    got = read_squad_json(str(path))
    assert got == [
        SquadExample("1", "Who wrote notes?", "Ada Lovelace wrote notes.", ("Ada Lovelace", "Lovelace"),
                     (0, 4), False),
        SquadExample("2", "Who read them?", "Ada Lovelace wrote notes.", (), (), True),
    ]


def test_read_squad_json_v1_without_is_impossible(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "abc", "qas": [
        {"id": "x", "question": "q", "answers": [{"text": "abc", "answer_start": 0}]}]}]}]}))
    assert read_squad_json(str(path))[0].is_impossible is False


def test_read_squad_json_errors(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(InputError, match=f"{missing}: SQuAD file not found"):
        read_squad_json(str(missing))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=str(bad)):
        read_squad_json(str(bad))
    nokey = tmp_path / "nokey.json"
    qa = {"id": "1", "answers": []}  # no "question"
    nokey.write_text(json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [qa]}]}]}))
    with pytest.raises(InputError, match=f"{nokey}.*question"):
        read_squad_json(str(nokey))
