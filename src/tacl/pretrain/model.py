"""The starting checkpoint (fetched once on the login node, or a random encoder built from a config), the
student and teacher built from it, and the export of a trained student in Hugging Face format.

A BERT start model is a BertForPreTraining (MLM and NSP heads), its teacher a BertModel; another family's
(tacl.runtime.family) is its masked-LM model (AutoModelForMaskedLM), its teacher the bare encoder
(AutoModel). Every model loads with its family's attention implementation."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from tacl.pretrain.distributed import import_deepspeed
from tacl.runtime.family import START_META, Family, family, model_type_of
from tacl.runtime.hub import from_hub, load_tokenizer, resolve_pretrained
from tacl.runtime.io import InputError, atomic_path, read_json, sha256_file, write_json_atomic

log = logging.getLogger("tacl.pretrain")


def init_start_model(model: str, init: dict[str, Any], tokenizer_dir: str, out_dir: str) -> dict[str, Any]:
    """Write the starting checkpoint with the run's tokenizer: a BertForPreTraining directory for BERT, the
    family's masked-LM model for another.

    init.kind == "pretrained": `model` (HF name, directory or package:NAME), its family from its config's
    model_type; heads it lacks (e.g. a sentence-embedding encoder or an ELECTRA discriminator has no MLM
    head) are initialised fresh.
    init.kind == "random": an encoder of init.family (default bert) of the given size with the tokenizer's
    vocabulary and special tokens, seeded.
    """
    from transformers import AutoConfig, BertForPreTraining

    tok = load_tokenizer(tokenizer_dir)
    if init.get("kind", "pretrained") == "random":
        fam = family(init.get("family", "bert"), "model_init.family")
        torch.manual_seed(int(init.get("seed", 0)))
        student = random_model(fam, init, tok)
        source = f"random BERT {init}" if fam.name == "bert" else f"random {fam.name} {init}"
    else:
        path = resolve_pretrained(model)
        with from_hub(model, "model", "`model` or `finetune.extra_models` (whichever names it)"):
            fam = family(AutoConfig.from_pretrained(path).model_type, f"model {model!r}")
            if fam.name == "bert":
                student = BertForPreTraining.from_pretrained(path)
            else:
                student = pretrained_mlm(path, model)
        source = model
    if student.config.vocab_size < len(tok):
        raise InputError(f"model {model!r}: vocabulary {student.config.vocab_size} < tokenizer's {len(tok)}")
    with atomic_path(out_dir) as tmp:
        student.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        meta = {"source": source, "family": fam.name, "init": init,
                "parameters": sum(p.numel() for p in student.parameters()),
                "weights_sha256": sha256_file(tmp / "model.safetensors"), "given": {"model": model, "init": init}}
        write_json_atomic(tmp / START_META, meta)
    return meta


def random_model(fam: Family, init: dict[str, Any], tok: Any) -> Any:
    """A fresh model of family `fam` sized by `init` (model_init), with the tokenizer's vocabulary and its
    pad, [CLS]/<s> and [SEP]/</s> ids (the torch seed set by the caller): BertForPreTraining for BERT, else
    the family's masked-LM model. DeBERTa is built as DeBERTa-v3 (relative attention, no absolute positions,
    no token types); RoBERTa's and XLM-R's positions start after the padding id, as theirs do."""
    from transformers import AutoConfig, AutoModelForMaskedLM, BertConfig, BertForPreTraining

    size = {"vocab_size": len(tok), "hidden_size": init["hidden"], "num_hidden_layers": init["layers"],
            "num_attention_heads": init["heads"], "intermediate_size": init["intermediate"],
            "max_position_embeddings": init.get("max_position", 512), "pad_token_id": tok.pad_token_id}
    if fam.name == "bert":  # (as it always was: the demo's figures depend on it)
        return BertForPreTraining(BertConfig(**size))
    first = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
    last = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    specials = {"bos_token_id": first, "eos_token_id": last}
    if fam.name in ("roberta", "xlm-roberta"):
        extra = {"max_position_embeddings": size["max_position_embeddings"] + tok.pad_token_id + 1,
                 "type_vocab_size": 1}
    elif fam.name == "deberta-v2":
        extra = {"relative_attention": True, "position_biased_input": False, "pos_att_type": ["p2c", "c2p"],
                 "max_relative_positions": -1, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
                 "share_att_key": True, "type_vocab_size": 0}
    elif fam.name == "electra":
        extra = {"embedding_size": init["hidden"]}
    else:  # modernbert
        extra = {"cls_token_id": first, "sep_token_id": last}
    config = AutoConfig.for_model(fam.name, **{**size, **specials, **extra})
    return AutoModelForMaskedLM.from_config(config, attn_implementation=fam.attention)


def pretrained_mlm(path: str, model: str) -> Any:
    """A pretrained checkpoint of a family other than BERT as its masked-LM model; one without an MLM head gets
    a fresh one, and the log says so."""
    from transformers import AutoModelForMaskedLM

    student, info = AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
    prefix = student.base_model_prefix + "."
    fresh = [k for k in info["missing_keys"] if not k.startswith(prefix) and not k.endswith("position_ids")]
    if fresh:
        log.info("model %r: no masked-LM head in the checkpoint (%s, ...): a fresh one is initialised", model,
                 fresh[0])
    return student


def start_identity(start_dir: str) -> dict[str, Any]:
    path = Path(start_dir) / START_META
    if not path.is_file():
        raise InputError(f"{start_dir}: not a starting checkpoint written by `tacl pretrain init-model`")
    return read_json(path)


def start_family(start_dir: str) -> Family:
    """The family of a starting checkpoint, a folder (tacl.runtime.family.model_type_of: its tacl_start.json's
    family, else its config.json's model_type)."""
    found = model_type_of(start_dir)
    if found is None:
        raise InputError(f"start model {start_dir}: no folder with a config.json that names its model_type (the "
                         "start model is the folder `tacl pretrain init-model` writes)")
    return family(found, f"start model {start_dir}")


def attention(model_dir: str) -> str:
    """The attn_implementation a checkpoint's models load with: its family's (tacl.runtime.family). SDPA
    (PyTorch's scaled_dot_product_attention: flash / memory-efficient kernels on GPUs) where transformers has
    it: the objectives pass it a boolean padding mask (tacl.objectives.encoders), or none for a micro-batch
    without padding (then SDPA may pick flash attention); DeBERTa's eager attention where it has not."""
    return start_family(model_dir).attention


def load_student(start_dir: str) -> Any:
    """BertForPreTraining for a BERT start model, else its family's masked-LM model."""
    from transformers import AutoModelForMaskedLM, BertForPreTraining

    fam = start_family(start_dir)
    auto = BertForPreTraining if fam.name == "bert" else AutoModelForMaskedLM
    return auto.from_pretrained(start_dir, attn_implementation=fam.attention)


def load_teacher(start_dir: str) -> Any:
    """A frozen copy of the starting encoder, outside the optimizer."""
    from transformers import AutoModel

    fam = start_family(start_dir)
    teacher = AutoModel.from_pretrained(start_dir, attn_implementation=fam.attention, **without_pooler(fam))
    teacher.requires_grad_(False)
    return teacher


def without_pooler(fam: Family) -> dict[str, Any]:
    """AutoModel's keyword arguments for an encoder without the pooler that BERT's and RoBERTa's models add
    (no objective reads a teacher's pooled output; RoBERTa's masked-LM checkpoints have none to load)."""
    return {"add_pooling_layer": False} if fam.name in ("bert", "roberta", "xlm-roberta") else {}


def export_model(state_dict: dict[str, torch.Tensor] | None, start_dir: str, out_dir: str,
                 summary: dict[str, Any], summary_path: str) -> None:
    """save_pretrained the student and its tokenizer: BertForPreTraining (encoder + MLM/NSP heads) for BERT,
    else the family's masked-LM model, which is reloaded from the written folder before it is put in place:
    its logits on a fixed batch must equal the trained model's, and AutoModel must load it.

    `state_dict` None exports the starting checkpoint itself (objective `none`)."""
    from transformers import AutoModelForMaskedLM, BertForPreTraining

    bert = start_family(start_dir).name == "bert"
    model = (BertForPreTraining if bert else AutoModelForMaskedLM).from_pretrained(start_dir)
    if state_dict is not None:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise InputError(f"export: checkpoint does not fit the model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
    tok = load_tokenizer(start_dir)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        if not bert:
            check_export(model, tmp, out_dir)
    write_json_atomic(summary_path, summary)


def check_export(model: Any, folder: Path, out_dir: str) -> None:
    """The folder written by an export reloads as the model it was written from: AutoModelForMaskedLM's logits
    on a fixed small batch equal the model's (fp32 on the CPU, a tight tolerance), and AutoModel loads it.
    An error naming `out_dir` otherwise."""
    from transformers import AutoModel, AutoModelForMaskedLM

    ids = torch.arange(2 * 12).remainder(model.config.vocab_size).view(2, 12)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        before = model.float().eval()(input_ids=ids, attention_mask=mask).logits
        reloaded = AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
        after = reloaded(input_ids=ids, attention_mask=mask).logits
    if not torch.allclose(before, after, rtol=1e-5, atol=1e-5):
        raise RuntimeError(f"export {out_dir}: the written model reloads with other logits (largest difference "
                           f"{(before - after).abs().max().item():.3g})")
    AutoModel.from_pretrained(str(folder))


def clean_state_dict(state: dict[str, torch.Tensor], prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The student's weights from a state dict of the training wrapper (`model.*`; the objective's own
    parameters, `objective.*`, are left out), in fp32."""
    return {k[len(prefix):]: v.float() for k, v in state.items() if k.startswith(prefix)}


def universal_fp32_state_dict(checkpoint_root: Path, tag: str) -> dict[str, torch.Tensor]:
    """The fp32 masters of a checkpoint of DeepSpeed's BF16_Optimizer (bf16 at ZeRO 1 before data_version 3,
    tacl.pretrain.settings; runs since train an fp32 model at every stage), whose files
    DeepSpeed 0.19.8's zero_to_fp32 does not read: from its universal conversion (made once, as a resume on
    another number of ranks makes it), which holds every parameter's fp32 master by name."""
    from tacl.pretrain import checkpoint
    from tacl.pretrain.distributed import DistEnv

    universal = checkpoint.make_universal(checkpoint_root.parent, tag, DistEnv(0, 1, 0, torch.device("cpu")))
    zero = universal / tag / "zero"
    return {d.name: torch.load(d / "fp32.pt", map_location="cpu", weights_only=False)["param"]
            for d in sorted(zero.iterdir()) if (d / "fp32.pt").is_file()}


def checkpoint_state_dict(checkpoint_root: str | os.PathLike, tag: str) -> dict[str, torch.Tensor]:
    """fp32 weights from a DeepSpeed checkpoint: ZeRO 1-3 (fp32 or bf16) from the optimizer's fp32 master
    copy (`universal_fp32_state_dict` for BF16_Optimizer's), ZeRO 0 from the module itself, which is fp32 in
    both precisions (bf16 at ZeRO 0 trains fp32 weights under autocast: tacl.pretrain.trainer). A ZeRO 0
    module in bf16 has no fp32 masters to export: refused."""
    root = Path(checkpoint_root)
    files = os.listdir(root / tag)
    if any(f.endswith("optim_states.pt") for f in files):
        import_deepspeed()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        try:
            return clean_state_dict(get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag))
        except ValueError as e:
            if "is not a zero checkpoint" not in str(e):
                raise
        return clean_state_dict(universal_fp32_state_dict(root, tag))
    model_file = root / tag / "mp_rank_00_model_states.pt"
    if not model_file.is_file():
        raise InputError(f"{root / tag}: no DeepSpeed model states in this checkpoint")
    module = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
    low = sorted(k for k, v in module.items() if v.is_floating_point() and v.dtype != torch.float32)
    if low:
        raise InputError(f"{model_file}: weights in {module[low[0]].dtype} ({low[0]}, ...), not the fp32 masters; "
                         "exporting them would lose precision")
    return clean_state_dict(module)
