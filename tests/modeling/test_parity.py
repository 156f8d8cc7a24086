"""bertforge's encoder and heads against Hugging Face transformers (the "peer"), and checkpoint I/O.

Every comparison runs in eval mode, fp32, with the same weights in both libraries; weights move
between them only through checkpoints on disk (bertforge `save_pretrained` -> transformers
`from_pretrained` and the other way round), so each parity test also proves the round trip.
Tolerance: 1e-5 absolute. Hidden states are compared at real (non-padding) positions only: what a
padding row holds is arbitrary. The last part checks bertforge's inference fast paths (in-place ops,
reused buffers, key trimming, the fused QKV weight) against its own autograd path, bit for bit.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import bertforge.modeling.bert as bert_module
import bertforge.modeling.kernels as kernels_module
from bertforge.modeling import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

transformers = pytest.importorskip("transformers")

TOL = 1e-5
# Inside the encoder, inference on CPU runs its float32 matmuls in oneDNN, which sums in another order
# than the peer's BLAS: each layer's hidden states agree to this fraction of the layer's largest value
# (a few float32 ulps of it; rounding scales with the values, which grow in the middle layers). Through the BLAS
# (BERTFORGE_ONEDNN_LINEAR=0) they are the peer's bit for bit.
LAYER_REL_TOL = 2e-6
# Positions of [PAD] in a padding="max_length" batch: outputs no one reads, but the peer computes them too.
PADDING_TOL = 1e-4
BATCH = 32
MAX_LENGTH = 128


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def peer_load(cls_name: str, directory: Path, **kwargs):
    """transformers' class of that name from `directory`, with its loading info; eval mode."""
    model, info = getattr(transformers, cls_name).from_pretrained(directory, output_loading_info=True, **kwargs)
    return model.eval(), info


def assert_clean_loading_info(info: dict) -> None:
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{key}: {info[key]}"


def encode_batches(tokenizer, pairs, batch_size=BATCH):
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        yield tokenizer.encode_batch([a for a, _ in chunk], [b for _, b in chunk], max_length=MAX_LENGTH,
                                     padding="longest", return_tensors="pt")


def random_batch(seed: int, lengths=(24, 19, 9, 14), vocab_size=30522):
    """Token ids with [CLS] first and `[SEP]` ends, two segments, right padding to the longest row."""
    generator = torch.Generator().manual_seed(seed)
    seq = max(lengths)
    input_ids = torch.randint(1000, vocab_size, (len(lengths), seq), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, 0] = 101
        input_ids[row, length - 1] = 102
        input_ids[row, length:] = 0
        token_type_ids[row, length // 2:length] = 1
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def mlm_labels(batch: dict, seed: int, vocab_size=30522) -> torch.Tensor:
    """HF-style labels: -100 except at ~15 % of the real tokens (at least one per row)."""
    generator = torch.Generator().manual_seed(seed)
    mask = batch["attention_mask"].bool()
    chosen = (torch.rand(mask.shape, generator=generator) < 0.15) & mask
    chosen[:, 1] = True
    labels = torch.randint(0, vocab_size, mask.shape, generator=generator)
    return labels.masked_fill(~chosen, -100)


# ----------------------------------------------------------------------------- the real checkpoint


@pytest.fixture(scope="module")
def minilm_ours(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir)
    assert not model.load_report.newly_initialized and not model.load_report.unused
    return model


@pytest.fixture(scope="module")
def minilm_peer(minilm_dir):
    model, info = peer_load("BertModel", minilm_dir, attn_implementation="sdpa")
    assert_clean_loading_info(info)
    return model


@pytest.fixture(scope="module")
def minilm_peer_eager(minilm_dir):
    return peer_load("BertModel", minilm_dir, attn_implementation="eager")[0]


@torch.inference_mode()
def test_minilm_matches_peer_on_glue_pairs(minilm_ours, minilm_peer, minilm_tokenizer, glue_sentence_pairs):
    """last_hidden_state, pooler_output and every layer's hidden states, on 504 real pairs."""
    worst_hidden, worst_pooled, worst_layers = _worst_differences(minilm_ours, minilm_peer, minilm_tokenizer,
                                                                  glue_sentence_pairs)
    assert worst_hidden <= TOL, worst_hidden
    assert worst_pooled <= TOL, worst_pooled
    assert all(diff <= LAYER_REL_TOL * scale for diff, scale in worst_layers), worst_layers


@torch.inference_mode()
def test_minilm_through_the_blas_is_the_peer_bit_for_bit(minilm_ours, minilm_peer, minilm_tokenizer,
                                                         glue_sentence_pairs, blas_linear):
    """With BERTFORGE_ONEDNN_LINEAR=0 the matmuls are the peer's BLAS calls: every layer's hidden states
    at real positions, and the pooled vector, are the peer's exactly on 504 real pairs."""
    worst_hidden, worst_pooled, worst_layers = _worst_differences(minilm_ours, minilm_peer, minilm_tokenizer,
                                                                  glue_sentence_pairs)
    assert worst_hidden == worst_pooled == 0.0
    assert all(diff == 0.0 for diff, _ in worst_layers), worst_layers


def _worst_differences(ours_model, peer_model, tokenizer, pairs) -> tuple[float, float, list[tuple[float, float]]]:
    """The largest |ours - peer| over `pairs` at real positions: last hidden state, pooled vector, and
    per layer (difference, the peer's largest |value| there)."""
    layers = ours_model.config.num_hidden_layers
    worst_hidden = worst_pooled = 0.0
    worst_layers = [(0.0, 0.0)] * (layers + 1)
    count = mixed_batches = truncated = 0
    for batch in encode_batches(tokenizer, pairs):
        mask = batch["attention_mask"].bool()
        lengths = mask.sum(1)
        mixed_batches += int(lengths.min() < lengths.max())
        truncated += int((lengths == MAX_LENGTH).sum())
        ours = ours_model(**batch, output_hidden_states=True)
        peer = peer_model(**batch, output_hidden_states=True)
        worst_hidden = max(worst_hidden, max_diff(ours.last_hidden_state[mask], peer.last_hidden_state[mask]))
        worst_pooled = max(worst_pooled, max_diff(ours.pooler_output, peer.pooler_output))
        assert len(ours.hidden_states) == len(peer.hidden_states) == layers + 1
        worst_layers = [(max(w, max_diff(a[mask], b[mask])), max(scale, b[mask].abs().max().item()))
                        for (w, scale), a, b in zip(worst_layers, ours.hidden_states, peer.hidden_states)]
        count += len(lengths)
    assert count >= 500
    assert mixed_batches >= count // BATCH  # every full batch mixes lengths: padding is exercised
    assert truncated > 0  # some RTE pairs are cut to max_length
    return worst_hidden, worst_pooled, worst_layers


@torch.inference_mode()
def test_minilm_attentions_match_peer(minilm_ours, minilm_peer_eager, minilm_tokenizer, glue_sentence_pairs):
    """output_attentions (explicit probabilities) against the peer's eager attention, two batches."""
    config = minilm_ours.config
    # The first MRPC pairs, and the last RTE pairs (longer, some truncated).
    for pairs in (glue_sentence_pairs[:16], glue_sentence_pairs[-16:]):
        batch = next(encode_batches(minilm_tokenizer, pairs))
        mask = batch["attention_mask"].bool()
        assert not mask.all()
        ours = minilm_ours(**batch, output_hidden_states=True, output_attentions=True)
        peer = minilm_peer_eager(**batch, output_hidden_states=True, output_attentions=True)
        assert len(ours.attentions) == len(peer.attentions) == config.num_hidden_layers
        for layer, (a, b) in enumerate(zip(ours.hidden_states, peer.hidden_states)):
            assert max_diff(a[mask], b[mask]) <= TOL, f"hidden state {layer} (eager)"
        for layer, (a, b) in enumerate(zip(ours.attentions, peer.attentions)):
            assert a.shape == (len(mask), config.num_attention_heads, mask.shape[1], mask.shape[1])
            real_queries = mask[:, None, :, None].expand_as(a)
            assert max_diff(a[real_queries], b[real_queries]) <= TOL, f"attention probabilities {layer}"
            assert torch.all(a.masked_select(~mask[:, None, None, :]) == 0), "padding keys get weight"
            assert torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5)
        assert max_diff(ours.last_hidden_state[mask], peer.last_hidden_state[mask]) <= TOL


@torch.inference_mode()
def test_minilm_max_length_padding_matches_peer_everywhere(minilm_ours, minilm_peer, minilm_tokenizer,
                                                           glue_sentence_pairs):
    """padding="max_length": inference skips the keys past the batch's longest row; every output,
    padding positions included, is still the peer's."""
    for size in (1, 16):
        pairs = glue_sentence_pairs[40:40 + size]
        batch = minilm_tokenizer.encode_batch([a for a, _ in pairs], [b for _, b in pairs], max_length=MAX_LENGTH,
                                              padding="max_length", return_tensors="pt")
        mask = bert_module.attention_mask_for(batch["attention_mask"], MAX_LENGTH, False, torch.device("cpu"),
                                              trim_keys=True)
        assert mask.shape[-1] < MAX_LENGTH and mask.shape[-1] % bert_module.KEY_BLOCK == 0
        assert mask.shape[-1] >= int(batch["attention_mask"].sum(1).max())
        ours, peer = minilm_ours(**batch), minilm_peer(**batch)
        real = batch["attention_mask"].bool()
        assert max_diff(ours.last_hidden_state[real], peer.last_hidden_state[real]) <= TOL
        assert max_diff(ours.last_hidden_state[~real], peer.last_hidden_state[~real]) <= PADDING_TOL
        assert max_diff(ours.pooler_output, peer.pooler_output) <= TOL


# ----------------------------------------------------------------------------- heads


@pytest.fixture(scope="module")
def base_pretraining(tmp_path_factory):
    """A seeded random BERT-base with both pre-training heads, and the peer's copy of it."""
    torch.manual_seed(1234)
    ours = BertForPreTraining(BertConfig.preset("base")).eval()
    directory = tmp_path_factory.mktemp("base_pretraining")
    ours.save_pretrained(directory)
    peer, info = peer_load("BertForPreTraining", directory)
    assert_clean_loading_info(info)
    return ours, peer


@torch.inference_mode()
def check_pretraining(ours, peer, seed: int, google_layout: bool = True):
    batch = random_batch(seed)
    labels = mlm_labels(batch, seed)
    nsp = torch.tensor([0, 1, 1, 0])
    mask = batch["attention_mask"].bool()

    a = ours(**batch)
    b = peer(**batch)
    assert max_diff(a.prediction_logits[mask], b.prediction_logits[mask]) <= TOL
    assert max_diff(a.seq_relationship_logits, b.seq_relationship_logits) <= TOL

    a = ours(**batch, labels=labels, next_sentence_label=nsp)
    b = peer(**batch, labels=labels, next_sentence_label=nsp)
    selected = labels != -100
    # Our `labels` path projects onto the vocabulary only at the labelled positions ...
    assert a.prediction_logits.shape == (int(selected.sum()), ours.config.vocab_size)
    assert max_diff(a.prediction_logits, b.prediction_logits[selected]) <= TOL
    # ... and its mean loss is still the peer's mean over the same positions.
    peer_mlm = F.cross_entropy(b.prediction_logits.reshape(-1, ours.config.vocab_size), labels.reshape(-1))
    peer_nsp = F.cross_entropy(b.seq_relationship_logits, nsp)
    assert abs(a.mlm_loss.item() - peer_mlm.item()) <= TOL
    assert abs(a.nsp_loss.item() - peer_nsp.item()) <= TOL
    assert abs(a.loss.item() - b.loss.item()) <= TOL

    if not google_layout:
        return
    # Google's layout (masked_lm_positions / masked_lm_labels) gives the same logits and loss.
    positions = torch.stack([row.nonzero().squeeze(-1)[:1].repeat(2) for row in selected])  # (B, 2)
    google_labels = labels.gather(1, positions)
    google_labels[:, 1] = -100  # a padded prediction slot
    a = ours(**batch, masked_lm_positions=positions, masked_lm_labels=google_labels)
    expected = b.prediction_logits.gather(1, positions[..., None].expand(-1, -1, ours.config.vocab_size))
    assert max_diff(a.prediction_logits, expected) <= TOL
    assert abs(a.mlm_loss.item() - F.cross_entropy(expected[:, 0], google_labels[:, 0]).item()) <= TOL


@pytest.mark.slow
def test_base_pretraining_matches_peer(base_pretraining):
    check_pretraining(*base_pretraining, seed=7, google_layout=False)


def test_tiny_pretraining_matches_peer(tmp_path):
    torch.manual_seed(5)
    ours = BertForPreTraining(BertConfig.preset("tiny")).eval()
    ours.save_pretrained(tmp_path)
    peer, info = peer_load("BertForPreTraining", tmp_path)
    assert_clean_loading_info(info)
    check_pretraining(ours, peer, seed=8)


def _seq_labels(num_labels):
    def make(batch, generator):
        if num_labels == 1:
            return {"labels": torch.randn(len(batch["input_ids"]), generator=generator)}
        return {"labels": torch.randint(0, num_labels, (len(batch["input_ids"]),), generator=generator)}
    return make


def _token_labels(batch, generator):
    labels = torch.randint(0, 5, batch["input_ids"].shape, generator=generator)
    labels[:, 0] = -100  # [CLS]
    return {"labels": labels.masked_fill(batch["attention_mask"] == 0, -100)}


def _qa_labels(batch, generator):
    seq = batch["input_ids"].shape[1]
    start = torch.randint(1, seq // 2, (len(batch["input_ids"]),), generator=generator)
    end = start + 2
    start[-1], end[-1] = seq + 5, seq + 9  # outside the window: ignored by both
    return {"start_positions": start, "end_positions": end}


def _mlm_labels(batch, generator):
    return {"labels": mlm_labels(batch, int(torch.randint(0, 1000, (), generator=generator)))}


HEADS = {
    "masked_lm": (BertForMaskedLM, {}, _mlm_labels),
    "sequence_classification_3": (BertForSequenceClassification, {"num_labels": 3}, _seq_labels(3)),
    "regression": (BertForSequenceClassification, {"num_labels": 1}, _seq_labels(1)),
    "token_classification": (BertForTokenClassification, {"num_labels": 5}, _token_labels),
    "question_answering": (BertForQuestionAnswering, {}, _qa_labels),
    "multiple_choice": (BertForMultipleChoice, {}, lambda batch, g: {"labels": torch.tensor([2, 0, 3])}),
}


def head_outputs(output) -> dict[str, torch.Tensor]:
    if hasattr(output, "start_logits"):
        return {"start_logits": output.start_logits, "end_logits": output.end_logits}
    return {"logits": output.logits}


@pytest.mark.parametrize("head", sorted(HEADS))
@torch.inference_mode()
def test_task_head_matches_peer(head, tmp_path):
    cls, overrides, make_labels = HEADS[head]
    torch.manual_seed(11)
    ours = cls(BertConfig.preset("tiny", **overrides)).eval()
    ours.save_pretrained(tmp_path)
    peer, info = peer_load(cls.__name__, tmp_path)
    assert_clean_loading_info(info)
    assert peer.config.num_labels == ours.config.num_labels

    batch = random_batch(seed=3)
    if cls is BertForMultipleChoice:  # (B, C, S): 3 examples of 4 choices
        lengths = (20, 17, 6, 11, 9, 20, 13, 8, 15, 12, 20, 5)
        batch = {k: v.reshape(3, 4, -1) for k, v in random_batch(seed=3, lengths=lengths).items()}
    labels = make_labels(batch, torch.Generator().manual_seed(13))

    a, b = ours(**batch), peer(**batch)
    real = batch["attention_mask"].bool()
    for name, value in head_outputs(a).items():
        expected = getattr(b, name)
        if value.dim() == 3 or cls is BertForQuestionAnswering:  # per token: real positions only
            value, expected = value[real], expected[real]
        assert max_diff(value, expected) <= TOL, name

    a, b = ours(**batch, **labels), peer(**batch, **labels)
    assert a.loss is not None and b.loss is not None
    expected = b.loss
    if cls is BertForQuestionAnswering:  # ours' span softmax runs over the real tokens only
        expected = qa_loss_over_real_tokens(b.start_logits, b.end_logits, batch["attention_mask"], labels)
        assert abs(b.loss.item() - expected.item()) > 1e-3  # the padding is a candidate in the peer's loss
    assert abs(a.loss.item() - expected.item()) <= TOL, (a.loss.item(), expected.item())


def qa_loss_over_real_tokens(start_logits, end_logits, attention_mask, labels) -> torch.Tensor:
    """The start and end cross-entropies with the padding positions left out of the softmax."""
    seq = start_logits.shape[1]
    losses = []
    for logits, gold in ((start_logits, labels["start_positions"]), (end_logits, labels["end_positions"])):
        logits = logits.float().masked_fill(attention_mask == 0, float("-inf"))
        losses.append(torch.nn.functional.cross_entropy(logits, gold.clamp(0, seq), ignore_index=seq))
    return (losses[0] + losses[1]) / 2


# ----------------------------------------------------------------------------- round trips


def _peer_head(cls_name: str, seed: int, **config):
    torch.manual_seed(seed)
    values = BertConfig.preset("tiny", **config).to_dict()
    return getattr(transformers, cls_name)(transformers.BertConfig(**values)).eval()


def _save_peer_bin(peer, directory: Path) -> None:
    """`safe_serialization=False` if the peer still honours it; otherwise torch.save of its state."""
    try:
        peer.save_pretrained(directory, safe_serialization=False)
    except TypeError:
        peer.save_pretrained(directory)
    if not (directory / "pytorch_model.bin").is_file():  # transformers 5 writes safetensors regardless
        (directory / "model.safetensors").unlink(missing_ok=True)
        torch.save(peer.state_dict(), directory / "pytorch_model.bin")  # tied decoder weights included


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("cls", [BertModel, BertForPreTraining, BertForSequenceClassification, BertForMaskedLM],
                         ids=lambda c: c.__name__)
@torch.inference_mode()
def test_peer_checkpoint_loads_in_bertforge(cls, fmt, tmp_path):
    peer = _peer_head(cls.__name__, seed=21, num_labels=3)
    if fmt == "bin":
        _save_peer_bin(peer, tmp_path)
        assert (tmp_path / "pytorch_model.bin").is_file() and not (tmp_path / "model.safetensors").exists()
    else:
        peer.save_pretrained(tmp_path)
        assert (tmp_path / "model.safetensors").is_file()
    ours = cls.from_pretrained(tmp_path)
    assert ours.load_report.newly_initialized == [] and ours.load_report.unused == []
    assert not ours.training

    batch = random_batch(seed=4)
    real = batch["attention_mask"].bool()
    a, b = ours(**batch), peer(**batch)
    if cls is BertModel:
        assert max_diff(a.last_hidden_state[real], b.last_hidden_state[real]) <= TOL
        assert max_diff(a.pooler_output, b.pooler_output) <= TOL
    elif cls is BertForPreTraining:
        assert max_diff(a.prediction_logits[real], b.prediction_logits[real]) <= TOL
        assert max_diff(a.seq_relationship_logits, b.seq_relationship_logits) <= TOL
    elif cls is BertForMaskedLM:
        assert max_diff(a.logits[real], b.logits[real]) <= TOL
    else:
        assert ours.config.num_labels == 3
        assert max_diff(a.logits, b.logits) <= TOL


@torch.inference_mode()
def test_minilm_round_trips_through_both_libraries(minilm_ours, minilm_peer, minilm_tokenizer,
                                                   glue_sentence_pairs, tmp_path):
    batch = next(encode_batches(minilm_tokenizer, glue_sentence_pairs[100:100 + BATCH]))
    mask = batch["attention_mask"].bool()
    reference = minilm_peer(**batch)

    minilm_ours.save_pretrained(tmp_path / "ours")  # bertforge -> transformers
    peer, info = peer_load("BertModel", tmp_path / "ours", attn_implementation="sdpa")
    assert_clean_loading_info(info)
    out = peer(**batch)
    assert max_diff(out.last_hidden_state[mask], reference.last_hidden_state[mask]) <= TOL
    assert max_diff(out.pooler_output, reference.pooler_output) <= TOL

    peer.save_pretrained(tmp_path / "peer")  # transformers -> bertforge
    ours = BertModel.from_pretrained(tmp_path / "peer")
    assert ours.load_report.newly_initialized == [] and ours.load_report.unused == []
    out = ours(**batch)
    assert max_diff(out.last_hidden_state[mask], reference.last_hidden_state[mask]) <= TOL
    assert max_diff(out.pooler_output, reference.pooler_output) <= TOL


def test_base_checkpoint_into_classifier_reports_new_head(minilm_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    assert model.load_report.newly_initialized == ["classifier.weight", "classifier.bias"]
    assert model.load_report.unused == []
    warnings = [r for r in caplog.records if r.name == "bertforge" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "classifier.weight" in warnings[0].getMessage() and "classifier.bias" in warnings[0].getMessage()
    assert model.classifier.weight.shape == (3, 384)
    encoder = BertModel.from_pretrained(minilm_dir)
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(model.bert.state_dict()[name], tensor), name


@torch.inference_mode()
def test_head_checkpoint_into_base_model(tmp_path, caplog):
    torch.manual_seed(31)
    head = BertForPreTraining(BertConfig.preset("tiny")).eval()
    head.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        base = BertModel.from_pretrained(tmp_path)
    assert base.load_report.newly_initialized == []
    assert sorted(base.load_report.unused) == sorted(k for k in head.state_dict() if k.startswith("cls."))
    # The head's tensors are left out: said in one WARNING line summarising them (not hidden at INFO).
    warnings = [r.getMessage() for r in caplog.records if r.name == "bertforge" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "7 tensors" in warnings[0] and "not used by this class" in warnings[0]
    assert "cls.predictions.* (5), cls.seq_relationship.* (2)" in warnings[0]
    batch = random_batch(seed=6)
    real = batch["attention_mask"].bool()
    a, b = base(**batch), head.bert(**batch)
    assert torch.equal(a.last_hidden_state[real], b.last_hidden_state[real])
    assert torch.equal(a.pooler_output, b.pooler_output)


def test_config_round_trip_keeps_unknown_keys(minilm_dir, minilm_ours, tmp_path):
    original = json.loads((minilm_dir / "config.json").read_text())
    config = BertConfig.from_pretrained(minilm_dir)
    for key in ("gradient_checkpointing", "use_cache", "_name_or_path", "transformers_version"):
        assert config.extra[key] == original[key]
    config.save_pretrained(tmp_path / "config")
    saved = json.loads((tmp_path / "config" / "config.json").read_text())
    for key, value in original.items():
        assert saved[key] == value, key
    assert BertConfig.from_pretrained(tmp_path / "config") == config

    # Through a model and through the peer's config, too.
    minilm_ours.save_pretrained(tmp_path / "model")
    assert BertConfig.from_pretrained(tmp_path / "model") == config
    peer_config = transformers.BertConfig.from_pretrained(tmp_path / "model")
    assert peer_config.hidden_size == 384 and peer_config.num_hidden_layers == 6
    peer_config.save_pretrained(tmp_path / "peer")
    again = BertConfig.from_pretrained(tmp_path / "peer")
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        assert getattr(again, name) == getattr(config, name)


# ----------------------------------------------------------------------------- the causal ablation


@torch.inference_mode()
def test_causal_outputs_ignore_later_tokens():
    torch.manual_seed(41)
    causal = BertModel(BertConfig.preset("tiny", is_causal=True)).eval()
    bidirectional = BertModel(BertConfig.preset("tiny")).eval()
    bidirectional.load_state_dict(causal.state_dict())
    batch = random_batch(seed=9)
    cut = 8
    perturbed = {k: v.clone() for k, v in batch.items()}
    perturbed["input_ids"][:, cut:] = torch.randint(1000, 30000, perturbed["input_ids"][:, cut:].shape)
    perturbed["token_type_ids"][:, cut:] = 1 - perturbed["token_type_ids"][:, cut:]
    for with_mask in (True, False):
        inputs = batch if with_mask else {k: v for k, v in batch.items() if k != "attention_mask"}
        changed = perturbed if with_mask else {k: v for k, v in perturbed.items() if k != "attention_mask"}
        a, b = causal(**inputs), causal(**changed)
        assert max_diff(a.last_hidden_state[:, :cut], b.last_hidden_state[:, :cut]) <= 1e-6
        assert max_diff(a.pooler_output, b.pooler_output) <= 1e-6  # [CLS] sees only itself
        assert max_diff(a.last_hidden_state[:, cut:], b.last_hidden_state[:, cut:]) > 1e-3
        # The switch matters: the bidirectional model's early positions do see the change.
        a, b = bidirectional(**inputs), bidirectional(**changed)
        assert max_diff(a.last_hidden_state[:, :cut], b.last_hidden_state[:, :cut]) > 1e-3
    # output_attentions (explicit probabilities): no weight above the diagonal.
    probs = causal(**batch, output_attentions=True).attentions
    seq = batch["input_ids"].shape[1]
    upper = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    assert all(torch.all(p[..., upper] == 0) for p in probs)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@torch.inference_mode()
def test_causal_matches_peer_decoder(attn, tmp_path):
    torch.manual_seed(43)
    ours = BertModel(BertConfig.preset("mini", is_causal=True)).eval()
    ours.save_pretrained(tmp_path)
    peer, info = peer_load("BertModel", tmp_path, is_decoder=True, attn_implementation=attn)
    assert_clean_loading_info(info)
    assert peer.config.is_decoder
    batch = random_batch(seed=10)
    real = batch["attention_mask"].bool()
    a = ours(**batch, output_attentions=attn == "eager")
    b = peer(**batch, use_cache=False, output_attentions=attn == "eager")
    assert max_diff(a.last_hidden_state[real], b.last_hidden_state[real]) <= TOL
    assert max_diff(a.pooler_output, b.pooler_output) <= TOL
    if attn == "eager":
        for x, y in zip(a.attentions, b.attentions):
            rows = real[:, None, :, None].expand_as(x)
            assert max_diff(x[rows], y[rows]) <= TOL
    # A peer-saved decoder config (is_decoder) loads back as causal.
    peer.save_pretrained(tmp_path / "peer")
    again = BertModel.from_pretrained(tmp_path / "peer")
    assert again.config.is_causal
    assert max_diff(again(**batch).last_hidden_state[real], a.last_hidden_state[real]) <= TOL


@pytest.fixture
def blas_linear(monkeypatch):
    """Inference through `F.linear` as in training, so that the two paths can agree bit for bit."""
    monkeypatch.setattr(kernels_module, "_ONEDNN_LINEAR", [None])


def test_fused_qkv_fast_path_tracks_the_parameters(blas_linear):
    """Without autograd the Q/K/V projection reads the three weights in place as one (3H, H)
    tensor; it must always equal the concatenation, whatever happened to the parameters."""
    torch.manual_seed(61)
    model = BertModel(BertConfig.preset("tiny")).eval()
    batch = random_batch(seed=12)
    real = batch["attention_mask"].bool()

    def outputs(grad: bool):
        with torch.set_grad_enabled(grad):
            return model(**batch).last_hidden_state[real].detach()

    assert torch.equal(outputs(False), outputs(True))  # fast path == autograd path (torch.cat)
    attention = model.encoder.layer[0].attention.self
    with torch.no_grad():  # in place, as optimizers and load_state_dict do
        attention.key.weight.mul_(1.5)
        attention.value.bias.add_(0.25)
    assert torch.equal(outputs(False), outputs(True))
    with torch.no_grad():  # re-allocated: the fast path must notice and concatenate
        attention.query.weight.data = attention.query.weight.data * 0.5
    assert torch.equal(outputs(False), outputs(True))
    model.double()
    with torch.no_grad():
        fast = model(**{k: v for k, v in batch.items()}).last_hidden_state[real]
    assert fast.dtype == torch.float64
    assert torch.equal(fast, model(**batch).last_hidden_state[real].detach())


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_inference_in_place_paths_match_and_respect_hooks(act, blas_linear):
    """Under no_grad the encoder adds residuals and applies the activation in place; the values are
    the autograd path's bit for bit, and a forward hook still sees the tensor its module returned."""
    torch.manual_seed(62)
    model = BertModel(BertConfig.preset("tiny", hidden_act=act)).eval()
    batch = random_batch(seed=14)
    reference = model(**batch, output_hidden_states=True)
    with torch.inference_mode():
        fast = model(**batch, output_hidden_states=True)
    for a, b in zip(reference.hidden_states, fast.hidden_states):
        assert torch.equal(a.detach(), b)
    captured = {}
    layer = model.encoder.layer[0]
    handles = [
        layer.intermediate.dense.register_forward_hook(lambda m, i, o: captured.setdefault("pre", o)),
        layer.output.dense.register_forward_hook(lambda m, i, o: captured.setdefault("ffn", o)),
        model.embeddings.word_embeddings.register_forward_hook(lambda m, i, o: captured.setdefault("emb", o)),
    ]
    try:
        with torch.no_grad():
            hooked = model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(hooked.last_hidden_state, reference.last_hidden_state.detach())
    with torch.no_grad():
        embedded = model.embeddings.word_embeddings(batch["input_ids"])
        mask = batch["attention_mask"].bool()[:, None, None, :]
        attended = layer.attention(model.embeddings(batch["input_ids"], batch["token_type_ids"]), mask)[0]
        pre_activation = layer.intermediate.dense(attended)
        ffn = layer.output.dense(layer.intermediate(attended))
    assert torch.equal(captured["emb"], embedded)  # not overwritten by the segment/position adds
    assert torch.equal(captured["pre"], pre_activation)  # not overwritten by the activation
    assert torch.equal(captured["ffn"], ffn)  # not overwritten by the residual add
    assert captured["pre"].min() < 0  # the activation would have changed it


def test_fast_paths_stand_aside_under_autocast():
    """Evaluation under autocast (the training loop's bf16/fp16) gets exactly the autograd path's
    numbers: no in-place op, reused buffer or oneDNN call changes a dtype there."""
    torch.manual_seed(64)
    model = BertForSequenceClassification(BertConfig.preset("mini", num_labels=3)).eval()
    batch = random_batch(seed=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(**batch).logits.detach()
        with torch.no_grad():
            no_grad = model(**batch).logits
        with torch.inference_mode():
            inference = model(**batch).logits
    assert torch.equal(no_grad, reference) and torch.equal(inference, reference)


def test_causal_key_trimming_keeps_outputs(blas_linear):
    """Inference cuts keys past the last real token; with the causal mask too, nothing changes."""
    torch.manual_seed(65)
    model = BertModel(BertConfig.preset("tiny", is_causal=True)).eval()
    batch = random_batch(seed=17, lengths=(70, 33, 9, 40))
    batch = {k: F.pad(v, (0, 58)) for k, v in batch.items()}  # 128 columns, the last 58 all padding
    reference = model(**batch).last_hidden_state.detach()
    with torch.inference_mode():
        trimmed = model(**batch).last_hidden_state
    mask = bert_module.attention_mask_for(batch["attention_mask"], 128, True, torch.device("cpu"), trim_keys=True)
    assert mask.shape[-1] == 96
    assert torch.equal(trimmed, reference)


def test_hooks_capture_every_layer_without_aliasing():
    """Inference reuses one buffer per projection across layers unless a hook could keep one: the
    activations captured from every layer are distinct, correct tensors."""
    torch.manual_seed(66)
    model = BertModel(BertConfig.preset("mini")).eval()
    batch = random_batch(seed=18)
    with torch.inference_mode():
        assert model._inference_fast_path(batch["input_ids"])
        reference = model(**batch, output_hidden_states=True)
    captured = []
    handles = [layer.intermediate.register_forward_hook(lambda m, i, o: captured.append(o))
               for layer in model.encoder.layer]
    try:
        with torch.inference_mode():
            assert not model._inference_fast_path(batch["input_ids"])
            hooked = model(**batch, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(hooked.last_hidden_state, reference.last_hidden_state)
    assert len({t.data_ptr() for t in captured}) == len(model.encoder.layer)
    with torch.inference_mode():
        for layer, attended_input, activation in zip(model.encoder.layer, reference.hidden_states, captured):
            mask = batch["attention_mask"].bool()[:, None, None, :]
            attended = layer.attention(attended_input, mask)[0]
            assert max_diff(layer.intermediate(attended), activation) <= TOL


def test_onednn_linear_is_the_default_and_switchable(monkeypatch):
    """Inference matmuls run in oneDNN by default (faster on CPU, different rounding, within TOL of the
    autograd path's F.linear); BERTFORGE_ONEDNN_LINEAR=0 keeps them F.linear's, bit for bit."""
    torch.manual_seed(63)
    model = BertModel(BertConfig.preset("mini")).eval()
    batch = random_batch(seed=15)
    real = batch["attention_mask"].bool()
    reference = model(**batch)  # autograd path: always F.linear

    monkeypatch.setenv("BERTFORGE_ONEDNN_LINEAR", "0")
    monkeypatch.setattr(kernels_module, "_ONEDNN_LINEAR", [])
    assert bert_module.onednn_linear_op() is None
    with torch.inference_mode():
        plain = model(**batch)
    assert torch.equal(plain.last_hidden_state, reference.last_hidden_state.detach())

    monkeypatch.delenv("BERTFORGE_ONEDNN_LINEAR")
    monkeypatch.setattr(kernels_module, "_ONEDNN_LINEAR", [])
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    assert bert_module.onednn_linear_op() is not None
    with torch.inference_mode():
        fast = model(**batch)
    assert not torch.equal(fast.last_hidden_state, plain.last_hidden_state)  # the other kernel ran
    assert max_diff(fast.last_hidden_state[real], reference.last_hidden_state[real].detach()) <= TOL
    assert max_diff(fast.pooler_output, reference.pooler_output.detach()) <= TOL


# ----------------------------------------------------------------------------- errors


@pytest.fixture
def tiny_checkpoint(tmp_path) -> Path:
    torch.manual_seed(51)
    BertModel(BertConfig.preset("tiny")).save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))


@pytest.mark.parametrize("change, disagreement", [
    ({"hidden_size": 64}, "hidden_size is 64 but embeddings.word_embeddings.weight has 128 columns"),
    ({"vocab_size": 1000}, "vocab_size is 1000 but embeddings.word_embeddings.weight has 30522 rows"),
    ({"intermediate_size": 256}, "intermediate_size is 256 but encoder.layer.0.intermediate.dense.weight has 512 rows"),
])
def test_shape_mismatch_names_field_tensor_and_sizes(tiny_checkpoint, change, disagreement):
    _edit_config(tiny_checkpoint, **change)
    for model_class in (BertModel, BertForSequenceClassification):  # into a head class too
        with pytest.raises(ValueError) as error:
            model_class.from_pretrained(tiny_checkpoint)
        message = str(error.value)
        assert disagreement in message and "\n" not in message
        assert message.startswith(f"{tiny_checkpoint / 'config.json'} disagrees with "
                                  f"{tiny_checkpoint / 'model.safetensors'}: ")


def test_missing_directory_and_weights(tmp_path, tiny_checkpoint):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        BertModel.from_pretrained(missing)
    (tiny_checkpoint / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as error:
        BertModel.from_pretrained(tiny_checkpoint)
    assert str(tiny_checkpoint) in str(error.value) and "model.safetensors" in str(error.value)
    (tiny_checkpoint / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        BertModel.from_pretrained(tiny_checkpoint)


@pytest.mark.parametrize("corruption", ["garbage", "truncated"])
def test_corrupt_safetensors_names_file(tiny_checkpoint, corruption):
    weights = tiny_checkpoint / "model.safetensors"
    if corruption == "garbage":
        weights.write_bytes(b"\x00\x01not a safetensors file" * 10)
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=str(weights)):
        BertModel.from_pretrained(tiny_checkpoint)


def test_corrupt_bin_names_file(tiny_checkpoint):
    (tiny_checkpoint / "model.safetensors").unlink()
    weights = tiny_checkpoint / "pytorch_model.bin"
    weights.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ValueError, match=str(weights)):
        BertModel.from_pretrained(tiny_checkpoint)


def test_input_longer_than_positions():
    model = BertModel(BertConfig.preset("tiny", max_position_embeddings=16)).eval()
    model(torch.ones(1, 16, dtype=torch.long))  # exactly the limit is fine
    with pytest.raises(ValueError, match=r"17 tokens.*16 position"):
        model(torch.ones(2, 17, dtype=torch.long))


def test_hidden_size_not_divisible_by_heads(tmp_path):
    with pytest.raises(ValueError, match=r"hidden_size \(100\).*num_attention_heads \(3\)"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match=r"hidden_size \(129\)"):
        BertConfig.preset("tiny", hidden_size=129)  # 2 heads
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 100, "num_attention_heads": 3}))
    with pytest.raises(ValueError) as error:
        BertConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(error.value) and "hidden_size (100)" in str(error.value)



@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_fused_activation_is_the_layer_and_steps_aside_for_hooks(act):
    """In float32 inference the feed-forward expansion applies its activation inside oneDNN's matmul;
    the result is the autograd path's within TOL, and a forward hook on the dense layer still sees
    (and may replace) that layer's own output."""
    if bert_module.onednn_linear_op() is None:
        pytest.skip("oneDNN's linear is not available here")
    torch.manual_seed(64)
    layer = bert_module.FeedForwardExpansion(BertConfig.preset("mini", hidden_act=act)).eval()
    x = torch.randn(2, 37, layer.dense.in_features)
    expected = layer(x).detach()  # with autograd: F.linear, then the activation
    with torch.inference_mode():
        fused = layer(x)
    assert max_diff(fused, expected) <= TOL
    seen = []
    handle = layer.dense.register_forward_hook(lambda module, args, out: seen.append(out) or out * 0)
    try:
        with torch.inference_mode():
            hooked = layer(x)
    finally:
        handle.remove()
    assert len(seen) == 1 and not hooked.any()  # the hook ran, and its replacement went through the activation
