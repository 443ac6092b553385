"""SQuAD v1.1 / v2.0: reading the data, sliding-window features, n-best span decoding and the official
EM / F1 metrics (with the v2.0 no-answer threshold search)."""

from __future__ import annotations

import collections
import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tacl.runtime.hub import from_hub
from tacl.runtime.io import InputError

HF_DATASETS = {"1.1": "rajpurkar/squad", "2.0": "rajpurkar/squad_v2"}
TOKENIZE_CHUNK = 1024  # examples per batched tokenizer call


@dataclass(frozen=True)
class SquadExample:
    id: str
    question: str
    context: str
    answers: tuple[str, ...]  # gold answer texts (dev has several, possibly repeated)
    answer_starts: tuple[int, ...]  # character offsets of each answer in context
    is_impossible: bool  # SQuAD 2.0 unanswerable (answers empty)


# ---------------------------------------------------------------------------------------------- reading


def read_squad_json(path: str) -> list[SquadExample]:
    """Every question of an official SQuAD v1.1 / v2.0 JSON file (`plausible_answers` are ignored)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: SQuAD file not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        examples = []
        for article in data["data"]:
            for para in article["paragraphs"]:
                context = para["context"]
                for qa in para["qas"]:
                    answers = qa["answers"]
                    examples.append(SquadExample(
                        id=str(qa["id"]), question=qa["question"], context=context,
                        answers=tuple(a["text"] for a in answers),
                        answer_starts=tuple(int(a["answer_start"]) for a in answers),
                        is_impossible=bool(qa.get("is_impossible", False))))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    except KeyError as e:
        raise InputError(f"{path}: not a SQuAD file (missing key {e})") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: not a SQuAD file ({e})") from None
    return examples


def load_hf(version: str, split: str, cache_dir: str | None = None) -> list[SquadExample]:
    """SQuAD `version` ("1.1" or "2.0"), `split` ("train" or "validation") from the Hugging Face hub."""
    if version not in HF_DATASETS:
        raise InputError(f"SQuAD version {version!r}: expected one of {sorted(HF_DATASETS)}")
    import datasets

    with from_hub(HF_DATASETS[version], "dataset", "`finetune.squad_source` (kind json)", cache_dir):
        ds = datasets.load_dataset(HF_DATASETS[version], split=split, cache_dir=cache_dir)
    return [SquadExample(id=str(r["id"]), question=r["question"], context=r["context"],
                         answers=tuple(r["answers"]["text"]),
                         answer_starts=tuple(int(s) for s in r["answers"]["answer_start"]),
                         is_impossible=not r["answers"]["text"])
            for r in ds]


# ---------------------------------------------------------------------------------------------- features


@dataclass
class Features:
    """One row per window; all lists have the same length, but `token_type_ids`, empty where the tokenizer
    gives none (RoBERTa's, ModernBERT's)."""

    input_ids: list[list[int]] = field(default_factory=list)
    token_type_ids: list[list[int]] = field(default_factory=list)
    attention_mask: list[list[int]] = field(default_factory=list)
    example_index: list[int] = field(default_factory=list)  # which example a window came from
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)  # context chars; None elsewhere
    start_positions: list[int] = field(default_factory=list)  # answer start token, 0 ([CLS]) if none here
    end_positions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def _truncate_questions(questions: list[str], tokenizer: Any, max_query_len: int) -> list[str]:
    """Each question cut after its `max_query_len`-th token (at that token's last character)."""
    enc = tokenizer(questions, add_special_tokens=False, truncation=True, max_length=max_query_len,
                    padding=False, return_offsets_mapping=True)
    return [q[:offs[-1][1]] if offs else q for q, offs in zip(questions, enc["offset_mapping"])]


def _answer_tokens(offsets: list[tuple[int, int] | None], start_char: int, end_char: int) -> tuple[int, int]:
    """Token span of characters [start_char, end_char) in one window, or (0, 0) if not wholly inside."""
    ctx = [i for i, o in enumerate(offsets) if o is not None]
    if not ctx or offsets[ctx[0]][0] > start_char or offsets[ctx[-1]][1] < end_char:
        return 0, 0
    starts = np.array([offsets[i][0] for i in ctx])
    ends = np.array([offsets[i][1] for i in ctx])
    first = int(np.flatnonzero(starts <= start_char)[-1])  # last token starting at or before the answer
    last = int(np.flatnonzero(ends >= end_char)[0])  # first token ending at or after it
    return ctx[first], ctx[max(first, last)]


def prepare_features(examples: list[SquadExample], tokenizer: Any, max_len: int = 384, doc_stride: int = 128,
                     max_query_len: int = 64, train: bool = True) -> Features:
    """`[CLS] question [SEP] context-window [SEP]` windows of at most `max_len` tokens, unpadded (batches
    are padded to their own longest row, not to max_len); consecutive windows of one context share
    `doc_stride` tokens. With `train`, targets come from the first gold answer (0 = [CLS] when
    it is not inside the window or the question is unanswerable); without, all targets are 0."""
    if doc_stride >= max_len - max_query_len - 3:
        raise ValueError(f"doc_stride {doc_stride} must be < max_len - max_query_len - 3 "
                         f"= {max_len - max_query_len - 3}")
    feats = Features()
    for lo in range(0, len(examples), TOKENIZE_CHUNK):
        chunk = examples[lo:lo + TOKENIZE_CHUNK]
        questions = _truncate_questions([ex.question for ex in chunk], tokenizer, max_query_len)
        enc = tokenizer(questions, [ex.context for ex in chunk], truncation="only_second", max_length=max_len,
                        stride=doc_stride, padding=False, return_overflowing_tokens=True,
                        return_offsets_mapping=True, return_attention_mask=True,
                        return_token_type_ids="token_type_ids" in tokenizer.model_input_names)
        for w, k in enumerate(enc["overflow_to_sample_mapping"]):
            seq_ids = enc.sequence_ids(w)
            offsets = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][w], seq_ids)]
            ex = chunk[k]
            start = end = 0
            if train and ex.answers and not ex.is_impossible:
                start_char = ex.answer_starts[0]
                start, end = _answer_tokens(offsets, start_char, start_char + len(ex.answers[0]))
            feats.input_ids.append(list(enc["input_ids"][w]))
            if "token_type_ids" in enc:  # (not from RoBERTa's or ModernBERT's tokenizer)
                feats.token_type_ids.append(list(enc["token_type_ids"][w]))
            feats.attention_mask.append(list(enc["attention_mask"][w]))
            feats.example_index.append(lo + k)
            feats.offsets.append(offsets)
            feats.start_positions.append(start)
            feats.end_positions.append(end)
    return feats


# ---------------------------------------------------------------------------------------------- decoding


def _best_span(start: np.ndarray, end: np.ndarray, ctx: np.ndarray, n_best: int | None,
               max_answer_len: int) -> tuple[float, int, int] | None:
    """(score, start token, end token) of the best valid span among the `n_best` highest start and end
    logits over context tokens `ctx` (all of them when `n_best` is None); None if there is no valid span."""
    if ctx.size == 0:
        return None
    s_idx = ctx[np.argsort(-start[ctx], kind="stable")[:n_best]]
    e_idx = ctx[np.argsort(-end[ctx], kind="stable")[:n_best]]
    length = e_idx[None, :] - s_idx[:, None] + 1
    scores = np.where((length >= 1) & (length <= max_answer_len), start[s_idx][:, None] + end[e_idx][None, :],
                      -np.inf)
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    if not np.isfinite(scores[i, j]):
        return None
    return float(scores[i, j]), int(s_idx[i]), int(e_idx[j])


def postprocess(examples: Sequence[SquadExample], features: Features, start_logits: Any, end_logits: Any,
                n_best: int = 20, max_answer_len: int = 30,
                version_2: bool = False) -> tuple[dict[str, str], dict[str, float]]:
    """Best answer text per example id, and its null odds (min [CLS] score over windows - best span score;
    +inf when no span qualifies). `start_logits`/`end_logits`: one row of logits per window, at least as
    long as the window (a (windows, max_len) array, or the ragged rows of per-batch padded predictions).

    For v1.1 (`version_2=False`) an example whose n-best candidates give no valid span falls back to the best
    of all valid spans, so "" is predicted only when no valid span exists at all."""
    start_logits = [np.asarray(row, dtype=np.float64) for row in start_logits]
    end_logits = [np.asarray(row, dtype=np.float64) for row in end_logits]
    short = [w for w in range(min(len(start_logits), len(end_logits), len(features)))
             if min(len(start_logits[w]), len(end_logits[w])) < len(features.offsets[w])]
    if len(start_logits) != len(features) or len(end_logits) != len(features) or short:
        raise ValueError(f"logits for {len(start_logits)} / {len(end_logits)} windows, {len(features)} "
                         f"expected" + (f"; window {short[0]} has fewer logits than tokens" if short else ""))
    windows: dict[int, list[int]] = collections.defaultdict(list)
    for w, k in enumerate(features.example_index):
        windows[k].append(w)
    predictions: dict[str, str] = {}
    null_odds: dict[str, float] = {}
    for k, ex in enumerate(examples):
        best: tuple[float, int, int, int] | None = None  # score, window, start, end
        score_null = np.inf
        for search in ((n_best,) if version_2 else (n_best, None)):
            for w in windows.get(k, []):
                score_null = min(score_null, float(start_logits[w][0] + end_logits[w][0]))
                ctx = np.array([i for i, o in enumerate(features.offsets[w]) if o is not None],
                               dtype=np.int64)
                span = _best_span(start_logits[w], end_logits[w], ctx, search, max_answer_len)
                if span is not None and (best is None or span[0] > best[0]):
                    best = (span[0], w, span[1], span[2])
            if best is not None:
                break
        if best is None:
            predictions[ex.id] = ""
            null_odds[ex.id] = float("inf")
        else:
            score, w, s, e = best
            offs = features.offsets[w]
            predictions[ex.id] = ex.context[offs[s][0]:offs[e][1]]
            null_odds[ex.id] = score_null - score
    return predictions, null_odds


# ---------------------------------------------------------------------------------------------- metrics

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace (official SQuAD)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version_2: bool = True) -> float:
    """Token F1 of the normalized texts. Empty texts as the official scripts: v2.0 scores 1.0 when both are
    empty, 0.0 when only one is; v1.1 scores 0.0 whenever there is no common token, both empty included."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref) if version_2 else 0.0
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def _golds(ex: SquadExample, version_2: bool) -> list[str]:
    """The golds a prediction is scored against: v2.0 keeps those that survive normalization ([""] when
    none does), v1.1 every gold text as it is (official scripts)."""
    if version_2:
        return [a for a in ex.answers if normalize_answer(a)] or [""]
    return list(ex.answers) or [""]


def _scores(golds: list[str], prediction: str, version_2: bool) -> tuple[float, float]:
    return (max(exact_match(prediction, g) for g in golds),
            max(f1(prediction, g, version_2) for g in golds))


def _best_threshold(odds: np.ndarray, with_pred: np.ndarray, with_null: np.ndarray) -> tuple[float, float]:
    """(best score in %, its threshold): questions are switched from "" to their prediction in increasing
    null-odds order (ties together), starting from all "" at threshold 0.0 as the official v2.0 script
    does."""
    order = np.argsort(odds, kind="stable")
    cum = with_null.sum() + np.cumsum(with_pred[order] - with_null[order])
    best, thresh = float(with_null.sum()), 0.0
    for i, idx in enumerate(order):
        last_of_tie = i + 1 == len(order) or odds[order[i + 1]] != odds[idx]
        if last_of_tie and cum[i] > best:
            best, thresh = float(cum[i]), float(odds[idx])
    return 100.0 * best / len(odds), thresh


def evaluate(examples: list[SquadExample], predictions: dict[str, str],
             null_odds: dict[str, float] | None = None, threshold: float | None = None,
             version_2: bool | None = None) -> dict[str, float]:
    """Official SQuAD scores in % (max over gold answers per question, averaged over questions), with the
    v1.1 or v2.0 script's definitions (`version_2`, by default: whether `null_odds` are given).

    With `null_odds` (v2.0), predictions whose odds exceed `threshold` (default 0.0, the Hugging Face QA
    example's, which the reference used: `exact`/`f1`) become "", and the best threshold tuned on these
    questions is reported too (`best_exact`/`best_f1`: never lower). A v2.0 question is answerable when
    its raw gold list is not empty, even if every gold normalizes to "". Every example needs a prediction."""
    v2 = null_odds is not None if version_2 is None else version_2
    if not examples:
        raise ValueError("evaluate: no examples")
    missing = [ex.id for ex in examples if ex.id not in predictions
               or (null_odds is not None and ex.id not in null_odds)]
    if missing:
        raise ValueError(f"evaluate: no prediction (or null odds) for {len(missing)} questions, "
                         f"e.g. {missing[:3]}")
    golds = [_golds(ex, v2) for ex in examples]
    has_ans = np.array([bool(ex.answers) for ex in examples])
    raw = np.array([_scores(g, predictions[ex.id], v2) for ex, g in zip(examples, golds)])  # (n, [em, f1])
    null = np.array([_scores(g, "", v2) for g in golds])
    final = raw
    out: dict[str, float] = {}
    if null_odds is not None:
        odds = np.array([null_odds[ex.id] for ex in examples], dtype=np.float64)
        final = np.where((odds > (0.0 if threshold is None else threshold))[:, None], null, raw)
        for j, name in enumerate(("exact", "f1")):
            out[f"best_{name}"], out[f"best_{name}_thresh"] = _best_threshold(odds, raw[:, j], null[:, j])
    out.update({"exact": 100.0 * final[:, 0].mean(), "f1": 100.0 * final[:, 1].mean(),
                "total": len(examples)})
    if has_ans.any() and not has_ans.all():
        for prefix, mask in (("HasAns", has_ans), ("NoAns", ~has_ans)):
            out[f"{prefix}_exact"] = 100.0 * final[mask, 0].mean()
            out[f"{prefix}_f1"] = 100.0 * final[mask, 1].mean()
            out[f"{prefix}_total"] = int(mask.sum())
    return {k: float(v) if not isinstance(v, int) else v for k, v in out.items()}
