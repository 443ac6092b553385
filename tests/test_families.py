"""Every objective on every encoder family (tacl.runtime.family): a tiny random start model of each family
(2 layers, hidden 32, the demo tokenizer's vocabulary) trains a step of every objective the family takes,
the step is the same cut into 1 or 2 micro-batches (and packed, where the family packs), the export reloads
with the same logits, what a family cannot train is refused in one line, and a fine-tune runs on a tokenizer
that gives no token type ids, and a run of every family resumes bit for bit."""

from __future__ import annotations

import contextlib
import itertools
import time

import pytest
import torch

from conftest import MINILM, TINY_BERT, run_params
from sync_guard import SyncGuard
from test_step import env  # noqa: F401 (the module's gloo process group)
from tacl.data.masking import MaskingSpec
from tacl.data.pretraining import Batching, PretrainingData
from tacl.data.shards import ShardSet
from tacl.objectives import GroupDraws, objective_draws
from tacl.objectives.registry import OBJECTIVES, build_objective, family_error
from tacl.runtime.family import FAMILIES
from tacl.runtime.io import InputError

NAMES = tuple(FAMILIES)
GLOBAL, MICRO, STEP = 8, 4, 8


@pytest.fixture(scope="module")
def starts(tmp_path_factory, tokenizer_dir):
    """A tiny random start model of every family, built once."""
    from tacl.pretrain.model import init_start_model

    root = tmp_path_factory.mktemp("families")
    for name in NAMES:
        init_start_model(MINILM, {**TINY_BERT, "family": name}, str(tokenizer_dir), str(root / name))
    return root


@pytest.fixture(scope="module")
def data(demo_data):
    from tacl.runtime.hub import load_tokenizer

    return (ShardSet(str(demo_data["manifest"]), verify=False),
            MaskingSpec.from_tokenizer(load_tokenizer(str(demo_data["start"])), 64))


def batch_of(data, name: str, micro: int, j: int, packing: bool = False, size: int = GLOBAL) -> dict:
    """Micro-batch j of step STEP; for a family without NSP, token type ids all 0 (its sequences' own, as
    the data stage writes them for it); the NSP labels stay, unread."""
    shards, spec = data
    batch = PretrainingData(shards, spec, 3, Batching(size, micro, True, packing=packing, max_len=64)).micro_batch(
        STEP, j)
    if not FAMILIES[name].nsp:
        batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
    return batch


def models(start, objective: str, packed: bool = False):
    from tacl.objectives.packed import use_packed_attention
    from tacl.pretrain.model import load_student, load_teacher

    torch.manual_seed(0)
    obj = build_objective(objective, run_params(objective, 2))
    student = load_student(str(start))
    teacher = load_teacher(str(start)) if obj.needs_teacher else None
    if hasattr(obj, "check"):
        obj.check(str(start))
    if hasattr(obj, "attach"):
        obj.attach(str(start), student)
    modules = [student, teacher, obj if isinstance(obj, torch.nn.Module) else None]
    if packed:
        use_packed_attention(*modules)
    for m in modules:
        if m is not None:
            m.eval()  # (dropout off: its draws depend on the layout)
    return student, teacher, obj


def step(start, data, name: str, objective: str, micro: int, packing: bool = False, size: int = GLOBAL,
         guard=None):
    """One step of `size` sequences: its loss terms and gradients (the trainer's averaging over the step's
    micro-batches); the objective's forward and backward inside `guard` where given."""
    student, teacher, obj = models(start, objective, packing)
    trainable = [p for m in (student, obj) if isinstance(m, torch.nn.Module) for p in m.parameters()]
    terms = {}
    for j in range(size // micro):
        batch = batch_of(data, name, micro, j, packing, size)
        draws = GroupDraws(torch.Generator(), lambda group: 1000 + group, first=j * micro)
        with guard or contextlib.nullcontext():
            losses, _ = obj(student, teacher, batch, objective_draws(obj, batch, draws))
            (sum(losses.values()) / (size // micro)).backward()
        for k, v in losses.items():
            terms[k] = terms.get(k, 0.0) + v.item() / (size // micro)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]
    return terms, grads, student


def refused(name: str, objective: str, packing: bool = False) -> str | None:
    return family_error(objective, run_params(objective, 2), FAMILIES[name], packing)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bert"])  # (BERT's: tests/test_invariance.py)
def test_every_objective_trains_a_step_of_every_family(starts, data, name):
    """A finite loss, MLM without NSP, gradients down to the embeddings, no host-device synchronisation."""
    from tacl.objectives.encoders import encoder

    trained = 0
    for objective in OBJECTIVES:
        if refused(name, objective):
            continue
        terms, grads, student = step(starts / name, data, name, objective, 4, size=4, guard=SyncGuard("cpu"))
        assert all(torch.isfinite(torch.tensor(v)) for v in terms.values()), (objective, terms)
        assert ("mlm" in terms or "clm" in terms) and "nsp" not in terms, (objective, terms)  # (no NSP head)
        embeddings = encoder(student).get_input_embeddings().weight
        assert embeddings.grad is not None and embeddings.grad.abs().sum() > 0, objective
        assert all(torch.isfinite(g).all() for g in grads), objective
        trained += 1
    assert trained == len(OBJECTIVES) - 1 - (name == "modernbert")  # (mlm_nsp; tacl_attn on ModernBERT)


def assert_same(got, ref):
    (terms, grads, _), (ref_terms, ref_grads, _) = got, ref
    assert terms.keys() == ref_terms.keys()
    for k in terms:
        assert terms[k] == pytest.approx(ref_terms[k], rel=1e-5), k
    scale = max(g.abs().max() for g in ref_grads)
    assert scale > 0
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bert"])  # (BERT's: tests/test_invariance.py)
@pytest.mark.parametrize("objective", ["mlm", "tacl"])
def test_the_step_is_the_same_in_any_micro_batch_of_every_family(starts, data, name, objective):
    ref = step(starts / name, data, name, objective, GLOBAL)
    assert_same(step(starts / name, data, name, objective, MICRO), ref)
    if FAMILIES[name].packing and objective == "tacl":  # (RoBERTa's and XLM-R's positions: the padding id + 1)
        assert_same(step(starts / name, data, name, objective, MICRO, packing=True), ref)


def test_what_a_family_cannot_train_is_refused_in_one_line():
    why = refused("roberta", "mlm_nsp")
    assert why is not None and "\n" not in why and why.startswith("pretrain.objectives:") and "use mlm" in why
    assert refused("bert", "mlm_nsp") is None and refused("roberta", "mlm") is None
    assert refused("modernbert", "tacl_attn").startswith("pretrain.objectives:")
    assert refused("deberta-v2", "tacl_attn") is None
    assert refused("deberta-v2", "tacl", packing=True).startswith("pretrain.packing:")
    assert refused("roberta", "tacl", packing=True) is None
    assert family_error("taco", {"keep_nsp": True}, FAMILIES["electra"]).startswith("pretrain.taco.keep_nsp:")


def test_the_trainer_refuses_mlm_nsp_on_roberta_before_building_anything(starts, monkeypatch):
    from types import SimpleNamespace

    from tacl.pretrain import trainer

    settings = SimpleNamespace(micro_batch=8, objective="mlm_nsp", objective_params={}, packing=False,
                               accumulation=lambda world: 1)
    args = SimpleNamespace(settings=settings, start_model=str(starts / "roberta"))
    monkeypatch.setattr(trainer, "load_student", lambda *a: pytest.fail("built a model"))
    with pytest.raises(InputError, match=r"^pretrain.objectives: mlm_nsp .* use mlm"):
        trainer._check_inputs(args, SimpleNamespace(world_size=1))


def test_modernbert_masks_are_transformers_own(starts, data):
    """The masks made for ModernBERT's global and sliding-window layers give the output its 2-D mask gives."""
    from transformers import AutoModel

    from tacl.objectives.encoders import padded_inputs

    model = AutoModel.from_pretrained(str(starts / "modernbert")).eval()
    model.config.sliding_window = 4  # (narrower than the batch: the band matters)
    batch = batch_of(data, "modernbert", GLOBAL, 0)
    assert not batch["attention_mask"].all()
    with torch.no_grad():
        ours = model(**padded_inputs(model, batch)).last_hidden_state
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_the_export_reloads_with_the_same_logits(starts, tmp_path, name):
    from transformers import AutoConfig, AutoModel

    from tacl.pretrain.model import export_model, load_student

    student = load_student(str(starts / name))
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.01)  # (trained: not the start model's weights)
    state = student.state_dict()
    export_model(state, str(starts / name), str(tmp_path / "out"), {"ok": 1}, str(tmp_path / "summary.json"))
    assert AutoConfig.from_pretrained(str(tmp_path / "out")).model_type == name
    reloaded = load_student(str(tmp_path / "out"))
    for k, v in reloaded.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0, msg=k)
    AutoModel.from_pretrained(str(tmp_path / "out"))


def test_an_export_that_reloads_otherwise_is_an_error(starts, tmp_path):
    from tacl.pretrain.model import check_export, load_student

    model = load_student(str(starts / "roberta"))
    model.save_pretrained(str(tmp_path))
    check_export(model, tmp_path, "out")
    with torch.no_grad():
        model.lm_head.bias.add_(1.0)
    with pytest.raises(RuntimeError, match="export out: the written model reloads with other logits"):
        check_export(model, tmp_path, "out")


@pytest.mark.parametrize("name", ["roberta", "deberta-v2", "modernbert"])
def test_a_fine_tune_step_without_token_type_ids(starts, tmp_path, name):
    """A tokenizer that gives no token type ids (RoBERTa's, ModernBERT's): the rows carry what it gives, the
    batch the mask the family's attention takes, and the task model trains."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tacl.finetune import glue
    from tacl.finetune.common import load_task_model, pad_batch, takes_sdpa_mask, to_device
    from tacl.finetune.sequence import encode

    tokenizer = AutoTokenizer.from_pretrained(str(starts / name), model_input_names=["input_ids", "attention_mask"])
    examples = [glue.Example("a", "the cat sat", "on the mat", "entailment"),
                glue.Example("b", "no", "yes it is", "not_entailment")]
    rows = encode(tokenizer, "rte", examples, 32)
    assert set(rows[0]) == {"input_ids", "attention_mask", "labels"}
    model = load_task_model(AutoModelForSequenceClassification, str(starts / name), 0, num_labels=2)
    assert model.config._attn_implementation == FAMILIES[name].attention
    batch = to_device(pad_batch(rows, tokenizer.pad_token_id), torch.device("cpu"), takes_sdpa_mask(model))
    out = model(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.base_model.get_input_embeddings().weight.grad.abs().sum() > 0


def test_every_family_gives_the_embedding_output_first(starts):
    """TACO reads hidden_states[0] as the embedding layer's output (after ELECTRA's projection) and
    hidden_states[-1] as the last layer's, of every family's encoder."""
    from tacl.pretrain.model import load_teacher

    ids = torch.arange(3, 19).view(2, 8)
    for name in NAMES:
        teacher = load_teacher(str(starts / name)).eval()
        with torch.no_grad():
            out = teacher(input_ids=ids, output_hidden_states=True)
            mask = {"mask": torch.ones_like(ids)} if name == "deberta-v2" else {}
            embedded = teacher.embeddings(input_ids=ids, **mask)
            if hasattr(teacher, "embeddings_project"):
                embedded = teacher.embeddings_project(embedded)
        assert len(out.hidden_states) == teacher.config.num_hidden_layers + 1, name
        torch.testing.assert_close(out.hidden_states[0], embedded, msg=name)
        torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, msg=name)


def test_a_pretrained_checkpoint_without_an_mlm_head_gets_one_and_the_log_says_so(tmp_path, tokenizer_dir, caplog):
    """An ELECTRA discriminator (ElectraForPreTraining: no MLM head) as the start model: its family's masked-LM
    model, the head fresh, one line in the log, the family in tacl_start.json; a model_type outside the
    families is refused naming `model`."""
    import logging

    from transformers import AutoConfig, ElectraForPreTraining, GPT2Config, GPT2Model

    from tacl.pretrain.model import START_META, init_start_model
    from tacl.runtime.hub import load_tokenizer
    from tacl.runtime.io import read_json

    tok = load_tokenizer(str(tokenizer_dir))
    config = AutoConfig.for_model("electra", vocab_size=len(tok), hidden_size=32, embedding_size=32,
                                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  pad_token_id=tok.pad_token_id)
    ElectraForPreTraining(config).save_pretrained(str(tmp_path / "discriminator"))
    with caplog.at_level(logging.INFO, logger="tacl.pretrain"):
        meta = init_start_model(str(tmp_path / "discriminator"), {"kind": "pretrained"}, str(tokenizer_dir),
                                str(tmp_path / "start"))
    said = [r.getMessage() for r in caplog.records if "no masked-LM head" in r.getMessage()]
    assert len(said) == 1 and "a fresh one is initialised" in said[0]
    assert meta["family"] == "electra" and read_json(tmp_path / "start" / START_META)["family"] == "electra"
    assert AutoConfig.from_pretrained(str(tmp_path / "start")).architectures == ["ElectraForMaskedLM"]
    GPT2Model(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=len(tok))).save_pretrained(str(tmp_path / "gpt2"))
    with pytest.raises(InputError, match=r"^model '.*gpt2': a gpt2 checkpoint; the start model must be one of bert"):
        init_start_model(str(tmp_path / "gpt2"), {"kind": "pretrained"}, str(tokenizer_dir), str(tmp_path / "no"))


def test_the_config_check_refuses_what_the_family_cannot_train(tmp_path):
    """Before any job: a random RoBERTa start model with mlm_nsp among the objectives, or with packing on a
    DeBERTa, is one line naming the key (the demo's BERT has none)."""
    from snakemake.utils import validate

    from conftest import REPO, demo_config, schema_as_json
    from tacl.experiment.config import load_schema, plan_errors

    schema = REPO / "workflow" / "schemas" / "config.schema.yaml"

    def errors(**overrides):
        cfg = demo_config(tmp_path, **overrides)
        validate(cfg, schema_as_json(schema), set_default=True)
        return plan_errors(cfg, load_schema(schema))

    assert errors() == []
    init = {"kind": "random", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "max_position": 128}
    found = errors(model_init={**init, "family": "roberta"}, **{"pretrain.objectives": ["mlm_nsp", "mlm", "tacl"],
                                                                "finetune.contrastive": {"forms": []}})
    assert len(found) == 1 and found[0].startswith("pretrain.objectives: mlm_nsp trains next sentence prediction")
    found = errors(model_init={**init, "family": "deberta-v2"}, **{"pretrain.objectives": ["tacl"],
                                                                   "pretrain.packing": True,
                                                                   "finetune.contrastive": {"forms": []}})
    assert found == ["pretrain.packing: a deberta-v2 start model's attention cannot read packed batches; set "
                     "pretrain.packing to false"]


@pytest.fixture(scope="module")
def sentences(demo_data, tokenizer_dir, tmp_path_factory):
    """The demo corpus in shards of the sentences form (the families without NSP), with the starts' tokenizer."""
    from tacl.data.build import build_shard, gather_shards
    from tacl.data.download import fetch_tokenizer

    root, corpus = tmp_path_factory.mktemp("sentences"), demo_data["dir"]
    tokenizer = fetch_tokenizer(str(tokenizer_dir), str(root / "tokenizer"), family="roberta")
    build_shard(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), tokenizer, 0, 1, 64, 0.1, 7,
                str(root / "shard-00000.bin"), str(root / "shard-00000.json"))
    gather_shards([str(root / "shard-00000.json")], str(root / "manifest.json"))
    return root / "manifest.json"


RESUME_STEPS = 3
TERMS = {"tacl": ("mlm", "tacl"), "coco_lm": ("aux_mlm", "clm", "scl")}  # (the loss terms each logs)


def chunks(start, manifest, run, dist_env, objective: str, *cuts: int) -> tuple[list, dict[str, torch.Tensor]]:
    """`RESUME_STEPS` steps of `objective` in chunks of `cuts` steps (the last chunk to the end), each as a
    chunk job runs it (tacl.pretrain.trainer: `_setup` builds everything afresh and resumes from the run's latest
    checkpoint, `_run_chunk` trains, logs and saves): the logged losses, and the final checkpoint's tensors by
    name: its module's (the student's `model.*`, the objective's own `objective.*`) and AdamW's state."""
    from tacl.pretrain import checkpoint
    from tacl.runtime.signals import StopSignals
    from tacl.pretrain.metrics import read_events, read_metrics
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, _run_chunk, _setup
    from tacl.runtime.lock import RunLock

    s = TrainSettings(objective=objective, steps=RESUME_STEPS, global_batch=4, micro_batch=4, lr=2e-3, seed=3,
                      max_len=64, loader_workers=0, device="cpu", log_every=1, objective_params=run_params(objective))
    for chunk, max_steps in enumerate([*cuts, None]):
        lock = RunLock(run)
        try:
            args = ChunkArgs(str(run), str(start), str(manifest), s, chunk=chunk, max_steps=max_steps,
                             tensorboard=False)
            marker = _run_chunk(_setup(args, dist_env, lock), StopSignals(), time.time())
        finally:
            lock.release()
    assert marker["done"] and marker["step"] == RESUME_STEPS
    assert [e["step"] for e in read_events(run)] == [0, *itertools.accumulate(cuts)]  # (where each chunk began)
    logged = [{k: v for k, v in m.items() if k not in ("elapsed_s", "tokens_per_s")} for m in read_metrics(run)]
    saved = torch.load(run / "checkpoints" / checkpoint.latest_tag(run) / "mp_rank_00_model_states.pt",
                       map_location="cpu", weights_only=False)  # (ZeRO 0: the whole state in one file)
    adam = {f"adam.{i}.{k}": v for i, state in saved["optimizer"]["state"].items() for k, v in state.items()}
    return logged, {**saved["module"], **adam}


# (BERT's TaCL: tests/test_pretrain.py's test_resume_is_bit_exact, in chunk jobs of their own, with killed saves)
@pytest.mark.parametrize("objective, name", [(o, n) for o in ("tacl", "coco_lm") for n in NAMES
                                             if n != "bert" or o == "coco_lm"])
def test_every_family_resumes_bit_exact(starts, sentences, demo_data, env, tmp_path, name, objective):  # noqa: F811
    """3 steps without a break, and 1 step, saved, then 2 more in a chunk that builds everything afresh and
    resumes: the same logged losses (and learning rates) and the same weights and AdamW state, bit for bit.
    TaCL: the student, its MLM head and the frozen teacher (loaded again from the start model), dropout on;
    COCO-LM: its auxiliary model of the family and its copy head (the objective's own parameters) and its
    draws (BERT's included, on NSP pairs)."""
    manifest = demo_data["manifest"] if FAMILIES[name].nsp else sentences
    whole, whole_weights = chunks(starts / name, manifest, tmp_path / "whole", env, objective)
    resumed, weights = chunks(starts / name, manifest, tmp_path / "resumed", env, objective, 1)
    assert [m["step"] for m in resumed] == list(range(1, RESUME_STEPS + 1))
    assert all(m[k] > 0 for m in resumed for k in TERMS[objective]), resumed
    assert resumed == whole, "every logged loss equals the uninterrupted run's, bit for bit"
    assert weights.keys() == whole_weights.keys()
    assert any(k.startswith("objective.") for k in weights) == (objective == "coco_lm")
    assert any(k.endswith(".exp_avg_sq") for k in weights)
    for k in weights:
        assert torch.equal(weights[k], whole_weights[k]), k


def test_every_reader_of_a_start_models_family_reads_the_same(starts, tmp_path):
    """The trainer, the shards' form check and the tokenizer job read a start model's family from its folder's
    JSON files (tacl.runtime.family.model_type_of; the report's: tests/test_report.py): tacl_start.json's family,
    else config.json's model_type. A folder with neither is no start model to the trainer."""
    import json

    from tacl.data.download import start_family as tokenizer_family
    from tacl.pretrain.form import start_family_name
    from tacl.pretrain.model import start_family
    from tacl.runtime.family import model_type_of

    for name in NAMES:
        start = str(starts / name)
        assert start_family(start).name == start_family_name(start) == tokenizer_family(start) == name
    folder = tmp_path / "start"
    folder.mkdir()
    assert model_type_of(folder) is None and model_type_of(tmp_path / "absent") is None
    with pytest.raises(InputError, match=r"^start model .*/start: no folder with a config.json that names"):
        start_family(str(folder))
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert model_type_of(folder) == "gpt2" and start_family_name(str(folder)) is None
    with pytest.raises(InputError, match=r"^start model .*/start: a gpt2 checkpoint; the start model must be one"):
        start_family(str(folder))
    (folder / "tacl_start.json").write_text(json.dumps({"family": "electra"}))
    assert model_type_of(folder) == "electra" == start_family(str(folder)).name == tokenizer_family(str(folder))
