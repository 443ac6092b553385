"""The starting checkpoint (fetched once on the login node, or a random BERT built from a config), the
student and teacher built from it, and the export of a trained student in Hugging Face format."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from tacl.runtime.hub import from_hub, load_tokenizer, resolve_pretrained
from tacl.runtime.io import InputError, atomic_path, read_json, sha256_file, write_json_atomic

START_META = "tacl_start.json"


def init_start_model(model: str, init: dict[str, Any], tokenizer_dir: str, out_dir: str) -> dict[str, Any]:
    """Write the starting checkpoint as a BertForPreTraining directory with the run's tokenizer.

    init.kind == "pretrained": `model` (HF name, directory or package:NAME); heads it lacks (e.g. a
    sentence-embedding encoder has no MLM head) are initialised fresh, as BertForPreTraining does.
    init.kind == "random": a BERT of the given size with the tokenizer's vocabulary, seeded.
    """
    from transformers import AutoConfig, BertConfig, BertForPreTraining

    tok = load_tokenizer(tokenizer_dir)
    if init.get("kind", "pretrained") == "random":
        torch.manual_seed(int(init.get("seed", 0)))
        config = BertConfig(vocab_size=len(tok), hidden_size=init["hidden"], num_hidden_layers=init["layers"],
                            num_attention_heads=init["heads"], intermediate_size=init["intermediate"],
                            max_position_embeddings=init.get("max_position", 512),
                            pad_token_id=tok.pad_token_id)
        student = BertForPreTraining(config)
        source = f"random BERT {init}"
    else:
        path = resolve_pretrained(model)
        with from_hub(model, "model", "`model` or `finetune.extra_models` (whichever names it)"):
            config = AutoConfig.from_pretrained(path)
            if config.model_type != "bert":
                raise InputError(f"model {model!r}: a {config.model_type} checkpoint, not BERT")
            student = BertForPreTraining.from_pretrained(path)
        source = model
    if student.config.vocab_size < len(tok):
        raise InputError(f"model {model!r}: vocabulary {student.config.vocab_size} < tokenizer's {len(tok)}")
    with atomic_path(out_dir) as tmp:
        student.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        meta = {"source": source, "init": init, "parameters": sum(p.numel() for p in student.parameters()),
                "weights_sha256": sha256_file(tmp / "model.safetensors"), "given": {"model": model, "init": init}}
        write_json_atomic(tmp / START_META, meta)
    return meta


def start_identity(start_dir: str) -> dict[str, Any]:
    path = Path(start_dir) / START_META
    if not path.is_file():
        raise InputError(f"{start_dir}: not a starting checkpoint written by `tacl pretrain init-model`")
    return read_json(path)


# PyTorch's scaled_dot_product_attention (flash / memory-efficient kernels on GPUs); the objectives pass it
# a boolean padding mask (tacl.objectives.encoder_inputs), which only this implementation takes, or none for a
# micro-batch without padding (then SDPA may pick flash attention).
ATTENTION = "sdpa"


def load_student(start_dir: str) -> Any:
    from transformers import BertForPreTraining

    return BertForPreTraining.from_pretrained(start_dir, attn_implementation=ATTENTION)


def load_teacher(start_dir: str) -> Any:
    """A frozen copy of the starting encoder, outside the optimizer."""
    from transformers import BertModel

    teacher = BertModel.from_pretrained(start_dir, add_pooling_layer=False, attn_implementation=ATTENTION)
    teacher.requires_grad_(False)
    return teacher


def export_model(state_dict: dict[str, torch.Tensor] | None, start_dir: str, out_dir: str,
                 summary: dict[str, Any], summary_path: str) -> None:
    """save_pretrained the student (BertForPreTraining: encoder + MLM/NSP heads) and its tokenizer.

    `state_dict` None exports the starting checkpoint itself (objective `none`)."""
    from transformers import BertForPreTraining

    model = BertForPreTraining.from_pretrained(start_dir)
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
    write_json_atomic(summary_path, summary)


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
