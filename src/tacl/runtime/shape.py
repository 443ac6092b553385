"""The size of an encoder of any family tacl.runtime.family knows (layers, widths, vocabulary, what its config
says of biases, embeddings and positions) and the parameters it holds: what the plan's estimates
(tacl.planning.estimates) and a fine-tuning seed's memory estimate (tacl.finetune.side_by_side) count.

`Shape.of_config` reads a checkpoint's config.json as transformers builds the model from it, with the
defaults of transformers' config classes for the keys a config leaves out; tests/test_plan.py keeps its
counts equal to the parameters of the masked-LM model transformers builds from a config of each family.
`PUBLISHED_CONFIGS` holds the sizes of the Hub models the example configs start from, so that the plan can
count them before they are downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tacl.runtime.family import FAMILIES

# The keys of each family's config class where a config.json leaves them out (transformers' BertConfig,
# RobertaConfig, XLMRobertaConfig, DebertaV2Config, ElectraConfig, ModernBertConfig; tests/test_plan.py
# compares them with those classes), and what the modelling code takes where the class has no such key.
DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2},
    "roberta": {"vocab_size": 50265, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 1},
    "xlm-roberta": {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 1},
    "deberta-v2": {"vocab_size": 128100, "max_position_embeddings": 512, "type_vocab_size": 0,
                   "position_biased_input": True, "relative_attention": False, "max_relative_positions": -1,
                   "position_buckets": -1, "share_att_key": False, "norm_rel_ebd": "none", "conv_kernel_size": 0},
    "electra": {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "embedding_size": 128},
    "modernbert": {"vocab_size": 50368, "max_position_embeddings": 8192, "attention_bias": False, "mlp_bias": False,
                   "norm_bias": False, "classifier_bias": False, "decoder_bias": True},
}

# The sizes in the config.json of the Hub models the example configs name (each as its model page on
# huggingface.co publishes it: https://huggingface.co/NAME/blob/main/config.json), for a plan made before the
# model is in the local cache. Only the keys the counts read; the plan says "from NAME's published
# config.json" where it uses one.
PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "roberta-base": {"model_type": "roberta", "num_hidden_layers": 12, "hidden_size": 768,
                     "intermediate_size": 3072, "vocab_size": 50265, "max_position_embeddings": 514,
                     "type_vocab_size": 1, "pad_token_id": 1},
    "xlm-roberta-base": {"model_type": "xlm-roberta", "num_hidden_layers": 12, "hidden_size": 768,
                         "intermediate_size": 3072, "vocab_size": 250002, "max_position_embeddings": 514,
                         "type_vocab_size": 1, "pad_token_id": 1},
    "microsoft/deberta-v3-base": {"model_type": "deberta-v2", "num_hidden_layers": 12, "hidden_size": 768,
                                  "intermediate_size": 3072, "vocab_size": 128100, "max_position_embeddings": 512,
                                  "type_vocab_size": 0, "position_biased_input": False, "relative_attention": True,
                                  "max_relative_positions": -1, "position_buckets": 256, "pos_att_type": "p2c|c2p",
                                  "share_att_key": True, "norm_rel_ebd": "layer_norm"},
    "google/electra-base-discriminator": {"model_type": "electra", "num_hidden_layers": 12, "hidden_size": 768,
                                          "intermediate_size": 3072, "vocab_size": 30522, "embedding_size": 768,
                                          "max_position_embeddings": 512, "type_vocab_size": 2},
    "answerdotai/ModernBERT-base": {"model_type": "modernbert", "num_hidden_layers": 22, "hidden_size": 768,
                                    "intermediate_size": 1152, "vocab_size": 50368, "max_position_embeddings": 8192,
                                    "attention_bias": False, "mlp_bias": False, "norm_bias": False,
                                    "classifier_bias": False, "decoder_bias": True, "pad_token_id": 50283},
}


def _linear(inputs: int, outputs: int, bias: bool) -> int:
    return inputs * outputs + (outputs if bias else 0)


@dataclass
class Shape:
    """An encoder's size. The first four fields and `source` are all a BERT needs; the rest default to BERT's
    and say how another family differs (Shape.of_config sets them from a config)."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    source: str = "the start model"
    family: str = "bert"
    positions: int = 512  # absolute position embeddings (0: none, rotary or relative positions only)
    type_vocab: int = 2  # token type embeddings (0: none)
    embedding: int | None = None  # the embeddings' width where narrower than hidden (ELECTRA, DeBERTa)
    glu: bool = False  # a gated feed-forward: its input layer is hidden x 2 intermediate (ModernBERT)
    attention_bias: bool = True  # the attention's linear layers have biases
    mlp_bias: bool = True  # the feed-forward's have
    norm_bias: bool = True  # the layer norms have
    head_bias: bool = True  # the MLM head's transform has
    decoder_bias: bool = True  # the MLM head's vocabulary projection has
    tied: bool = True  # the vocabulary projection is the word embeddings
    relative: int = 0  # DeBERTa's relative position embeddings (rows: twice the attention span)
    relative_norm: bool = False  # DeBERTa's layer norm of them (norm_rel_ebd)
    relative_terms: int = 0  # DeBERTa's disentangled attention terms beside content to content (c2p, p2c)
    position_projections: int = 0  # DeBERTa's per-layer projections of the relative embeddings (share_att_key off)
    conv: int = 0  # DeBERTa-v2's convolution kernel after the first layer (0: none)

    @classmethod
    def of_config(cls, config: dict[str, Any], source: str = "the start model") -> Shape:
        """The shape transformers builds from a checkpoint's config.json (its `model_type` a family of
        tacl.runtime.family; a config without one counts as BERT's)."""
        family = config.get("model_type") or "bert"
        c = {**DEFAULTS.get(family, DEFAULTS["bert"]), **{k: v for k, v in config.items() if v is not None}}
        h = c["hidden_size"]
        shape = cls(c["num_hidden_layers"], h, c["intermediate_size"], c["vocab_size"], source, family,
                    positions=c["max_position_embeddings"], type_vocab=c.get("type_vocab_size", 0),
                    tied=c.get("tie_word_embeddings", True))
        if family == "electra":
            shape.embedding = c["embedding_size"]
        elif family == "modernbert":
            shape.positions, shape.type_vocab, shape.glu = 0, 0, True
            shape.attention_bias, shape.mlp_bias, shape.norm_bias = c["attention_bias"], c["mlp_bias"], c["norm_bias"]
            shape.head_bias, shape.decoder_bias = c["classifier_bias"], c["decoder_bias"]
        elif family == "deberta-v2":
            shape.embedding = c.get("embedding_size", h)
            if not c["position_biased_input"]:
                shape.positions = 0
            terms = c.get("pos_att_type") or []
            terms = [t.strip() for t in terms.lower().split("|")] if isinstance(terms, str) else terms
            if c["relative_attention"]:
                span = c["max_relative_positions"] if c["max_relative_positions"] >= 1 else c["max_position_embeddings"]
                span = c["position_buckets"] if c["position_buckets"] > 0 else span
                shape.relative = 2 * span
                shape.relative_terms = sum(t in ("c2p", "p2c") for t in terms)
                shape.position_projections = 0 if c["share_att_key"] else shape.relative_terms
            shape.relative_norm = "layer_norm" in [x.strip() for x in str(c["norm_rel_ebd"]).lower().split("|")]
            shape.conv = c["conv_kernel_size"]
        return shape

    @property
    def width(self) -> int:
        """The embeddings' width (the MLM head's too, for ELECTRA and DeBERTa)."""
        return self.embedding or self.hidden

    def _norm(self, n: int) -> int:
        return n * (2 if self.norm_bias else 1)

    @property
    def encoder(self) -> int:
        """The parameters each token's forward pass multiplies by: every layer's attention, feed-forward and
        layer norms, the projection of narrower embeddings and DeBERTa's convolution (the non-embedding
        parameters: N of 6 N)."""
        h, i = self.hidden, self.intermediate
        layer = (4 * _linear(h, h, self.attention_bias) + _linear(h, (2 if self.glu else 1) * i, self.mlp_bias)
                 + _linear(i, h, self.mlp_bias) + 2 * self._norm(h))
        # (ModernBERT: its first layer has no norm before attention, and its final norm stands in for it)
        projection = _linear(self.width, h, self.family == "electra") if self.width != h else 0
        conv = h * h * self.conv + h + self._norm(h) if self.conv else 0
        return self.layers * layer + projection + conv

    @property
    def embeddings(self) -> int:
        """The lookup tables (words, positions, token types, DeBERTa's relative positions) and their norms."""
        norm = self._norm(self.hidden if self.family in ("deberta-v2", "modernbert") else self.width)
        relative = self.relative * self.hidden + (self._norm(self.hidden) if self.relative_norm else 0)
        tables = (self.vocab + self.positions + self.type_vocab) * self.width
        return tables + norm + relative + self.position_projections * self.layers * _linear(self.hidden, self.hidden,
                                                                                              True)

    @property
    def head(self) -> int:
        """What the MLM head multiplies per masked position: its transform and the vocabulary projection."""
        return self.hidden * self.width + self.width * self.vocab

    @property
    def masked_lm(self) -> int:
        """Every parameter of the family's masked-LM model (transformers' AutoModelForMaskedLM): the
        encoder, the embeddings and the MLM head (its vocabulary projection tied to the word embeddings,
        unless the config unties them)."""
        # (untied, BERT's, RoBERTa's and DeBERTa's projection has a bias of its own beside the head's)
        untied = self.width * self.vocab + (0 if self.family in ("electra", "modernbert") else self.vocab)
        head = (_linear(self.hidden, self.width, self.head_bias) + self._norm(self.width)
                + (self.vocab if self.decoder_bias else 0) + (0 if self.tied else untied))
        return self.encoder + self.embeddings + head

    @property
    def total(self) -> int:
        """Every parameter a start model holds: the masked-LM model's, and for a family pretrained with next
        sentence prediction the pooler and the NSP classifier (BERT's start model is BertForPreTraining)."""
        nsp = _linear(self.hidden, self.hidden, True) + _linear(self.hidden, 2, True)
        return self.masked_lm + (nsp if FAMILIES.get(self.family, FAMILIES["bert"]).nsp else 0)

    def attention_flops(self, seq: float) -> float:
        """Forward FLOPs per token of the attention scores and their weighted sum over `seq` positions, every
        layer; DeBERTa adds a score per relative position for each of its position terms. (ModernBERT's local
        layers are counted as dense: what attention with a window mask computes.)"""
        relative = self.relative_terms * 2 * self.relative * self.hidden
        return self.layers * (4 * self.hidden * seq + relative)
