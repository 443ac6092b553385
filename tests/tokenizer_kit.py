"""Small tokenizers of each kind the data stage takes, trained in a test with the `tokenizers` library and
saved as transformers tokenizer folders with their special tokens set (nothing comes from the Hub):

    wordpiece   BERT's kind: lower-cased WordPiece, [CLS] A [SEP] B [SEP]
    bpe         RoBERTa's kind: byte-level BPE ("Ġword" after a space), <s> ... </s>
    unigram     XLM-R's and DeBERTa-v3's kind: SentencePiece's Unigram with the Metaspace pre-tokenizer ("▁word"),
                <s> ... </s>

`train(kind, texts, out_dir)` returns the folder, which `tacl.runtime.hub.load_tokenizer` and
`tacl.data.download.fetch_tokenizer` read like any model's tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from conftest import REPO

KINDS = ("wordpiece", "bpe", "unigram")
# the special tokens of each kind, in the order they take the first ids
SPECIALS = {
    "wordpiece": {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"},
    "bpe": {"cls_token": "<s>", "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>",
            "mask_token": "<mask>"},
    "unigram": {"cls_token": "<s>", "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>",
                "mask_token": "<mask>"},
}


def demo_texts(limit: int = 600) -> list[str]:
    """Paragraphs of the demo corpus (examples/demo/wikipedia), tags left out."""
    lines = []
    for path in sorted((REPO / "examples" / "demo" / "wikipedia").glob("wiki_*")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith(("<doc", "</doc")):
                lines.append(line)
                if len(lines) >= limit:
                    return lines
    return lines


def backend(kind: str, texts: Iterable[str], vocab_size: int = 1000):
    """The Rust tokenizer of `kind`, trained on `texts`, with its post-processor (the specials around a
    sequence and a pair)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = list(SPECIALS[kind].values())
    cls, sep = SPECIALS[kind]["cls_token"], SPECIALS[kind]["sep_token"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r} (known: {', '.join(KINDS)})")
    tok.train_from_iterator(list(texts), trainer)
    cls_id, sep_id = tok.token_to_id(cls), tok.token_to_id(sep)
    pair = f"{cls} $A {sep} $B:1 {sep}:1" if kind == "wordpiece" else f"{cls} $A {sep} {sep} $B {sep}"
    tok.post_processor = processors.TemplateProcessing(single=f"{cls} $A {sep}", pair=pair,
                                                       special_tokens=[(cls, cls_id), (sep, sep_id)])
    return tok


def train(kind: str, texts: Iterable[str], out_dir: str | Path, vocab_size: int = 1000) -> Path:
    """A transformers tokenizer folder of `kind` trained on `texts`, its special tokens set."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=backend(kind, texts, vocab_size), **SPECIALS[kind])
    out = Path(out_dir)
    tok.save_pretrained(str(out))
    return out
