"""Convert Google's original TensorFlow BERT checkpoints to a Hugging Face-layout directory, without TensorFlow.

Google's checkpoints (`bert_model.ckpt.index` + `bert_model.ckpt.data-00000-of-00001`, from
run_pretraining.py, run_classifier.py or run_squad.py) are TF1 *tensor bundles*, read directly by
tf_bundle.py (no TensorFlow); this module maps their variable names and writes the directory.

The variables map onto the `BertForPreTraining` state-dict layout (`bert.encoder.layer.0...`) that
bertforge and Hugging Face transformers share; dense kernels are stored [in, out] by TF and
transposed to torch's [out, in].
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from .._files import atomic_path, write_text_atomic
from ..tokenization._read import read_json_object
from .tf_bundle import _Bundle, _masked_crc32c, read_tf_checkpoint  # noqa: F401 (re-exported)

__all__ = ["convert_tf_checkpoint", "map_tf_name", "read_tf_checkpoint"]


# --------------------------------------------------------------------------- name mapping

# Optimizer state and bookkeeping: AdamWeightDecayOptimizer's `<var>/adam_m|adam_v` (Google's
# optimization.py), tf.train.AdamOptimizer's `<var>/Adam`, `<var>/Adam_1`, `beta1_power`,
# `beta2_power`, and the global step.
_OPTIMIZER_STATE = re.compile(r"(^|/)(global_step|beta[12]_power)$|/(adam_m|adam_v|Adam(_\d+)?)$")

_LINEAR_SCOPES = (
    r"bert/encoder/layer_\d+/(?:attention/self/(?:query|key|value)|attention/output/dense|intermediate/dense|output/dense)"
    r"|bert/pooler/dense|cls/predictions/transform/dense"
)
_NORM_SCOPES = (
    r"bert/embeddings/LayerNorm|bert/encoder/layer_\d+/(?:attention/output|output)/LayerNorm"
    r"|cls/predictions/transform/LayerNorm"
)
_MODULE_VARIABLE = re.compile(
    rf"^(?:(?P<linear>{_LINEAR_SCOPES})/(?P<linear_leaf>kernel|bias)|(?P<norm>{_NORM_SCOPES})/(?P<norm_leaf>gamma|beta))$"
)
_LEAF_NAMES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}

# Variables that are not `<module>/<leaf>`, with the head each belongs to.
_NAMED_VARIABLES: dict[str, tuple[str, str]] = {
    "bert/embeddings/word_embeddings": ("bert.embeddings.word_embeddings.weight", "encoder"),
    "bert/embeddings/token_type_embeddings": ("bert.embeddings.token_type_embeddings.weight", "encoder"),
    "bert/embeddings/position_embeddings": ("bert.embeddings.position_embeddings.weight", "encoder"),
    # The MLM decoder weight is tied to the word embeddings: only its bias is stored.
    "cls/predictions/output_bias": ("cls.predictions.bias", "mlm"),
    # Already [out, in]: created with tf.get_variable, not tf.layers.dense.
    "cls/seq_relationship/output_weights": ("cls.seq_relationship.weight", "nsp"),
    "cls/seq_relationship/output_bias": ("cls.seq_relationship.bias", "nsp"),
    # run_classifier.py's create_model, outside any scope.
    "output_weights": ("classifier.weight", "classifier"),
    "output_bias": ("classifier.bias", "classifier"),
    # run_squad.py's create_model.
    "cls/squad/output_weights": ("qa_outputs.weight", "squad"),
    "cls/squad/output_bias": ("qa_outputs.bias", "squad"),
}


def _head_of(tf_name: str) -> str:
    """Which part of the model a mapped variable belongs to: encoder, mlm, nsp, classifier or squad."""
    if tf_name in _NAMED_VARIABLES:
        return _NAMED_VARIABLES[tf_name][1]
    return "mlm" if tf_name.startswith("cls/predictions/") else "encoder"


def map_tf_name(name: str) -> str | None:
    """The Hugging Face / bertforge state-dict name of a Google TF BERT variable.

    None for optimizer state and bookkeeping (adam_m, adam_v, Adam, Adam_1, beta1_power,
    beta2_power, global_step), which a conversion skips. Raises ValueError for any other variable,
    so that no user weight is dropped silently. A variable whose name ends in `/kernel` must be
    transposed from TF's [in, out] to torch's [out, in]; no other one.
    """
    if _OPTIMIZER_STATE.search(name):
        return None
    if name in _NAMED_VARIABLES:
        return _NAMED_VARIABLES[name][0]
    match = _MODULE_VARIABLE.match(name)
    if match is None:
        hint = ""
        if "/.ATTRIBUTES/" in name or name == "_CHECKPOINTABLE_OBJECT_GRAPH":
            hint = (
                " (this looks like a TF2 object-based checkpoint, e.g. from the TF Model Garden; only "
                "the TF1 checkpoints of Google's original BERT code are supported)"
            )
        raise ValueError(f"unknown variable {name!r} in the TensorFlow checkpoint{hint}")
    scope = match["linear"] or match["norm"]
    leaf = match["linear_leaf"] or match["norm_leaf"]
    return re.sub(r"layer_(\d+)", r"layer.\1", scope).replace("/", ".") + "." + _LEAF_NAMES[leaf]


# --------------------------------------------------------------------------- conversion

_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)

# The transformers class for the heads a checkpoint has: the first whose heads are all there.
_ARCHITECTURES = (
    ({"classifier"}, "BertForSequenceClassification"),
    ({"squad"}, "BertForQuestionAnswering"),
    ({"mlm", "nsp"}, "BertForPreTraining"),
    ({"mlm"}, "BertForMaskedLM"),
    ({"nsp"}, "BertForNextSentencePrediction"),
    (set(), "BertModel"),
)

# From Google's tokenization.validate_case_matches_checkpoint: released models whose names say
# nothing about case but that were trained lower-cased.
_LOWER_CASED_MODELS = ("multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12")


def _expected_shapes(config: dict, heads: set[str], num_labels: int) -> dict[str, tuple[int, ...]]:
    """TF name -> TF shape of every variable a model with `heads` has under bert_config.json."""
    H, FFN, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (V, H),
        "bert/embeddings/token_type_embeddings": (config["type_vocab_size"], H),
        "bert/embeddings/position_embeddings": (config["max_position_embeddings"], H),
    }

    def dense(scope: str, n_in: int, n_out: int) -> None:
        shapes[f"{scope}/kernel"], shapes[f"{scope}/bias"] = (n_in, n_out), (n_out,)

    def layer_norm(scope: str) -> None:
        shapes[f"{scope}/gamma"], shapes[f"{scope}/beta"] = (H,), (H,)

    layer_norm("bert/embeddings/LayerNorm")
    for n in range(config["num_hidden_layers"]):
        layer = f"bert/encoder/layer_{n}"
        for projection in ("query", "key", "value"):
            dense(f"{layer}/attention/self/{projection}", H, H)
        dense(f"{layer}/attention/output/dense", H, H)
        layer_norm(f"{layer}/attention/output/LayerNorm")
        dense(f"{layer}/intermediate/dense", H, FFN)
        dense(f"{layer}/output/dense", FFN, H)
        layer_norm(f"{layer}/output/LayerNorm")
    dense("bert/pooler/dense", H, H)
    if "mlm" in heads:
        dense("cls/predictions/transform/dense", H, H)
        layer_norm("cls/predictions/transform/LayerNorm")
        shapes["cls/predictions/output_bias"] = (V,)
    if "nsp" in heads:
        shapes["cls/seq_relationship/output_weights"], shapes["cls/seq_relationship/output_bias"] = (2, H), (2,)
    if "classifier" in heads:
        shapes["output_weights"], shapes["output_bias"] = (num_labels, H), (num_labels,)
    if "squad" in heads:
        shapes["cls/squad/output_weights"], shapes["cls/squad/output_bias"] = (2, H), (2,)
    return shapes


def _read_config(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"BERT config file not found: {path}")
    config = read_json_object(path, "BERT config")  # (bounded: a link to /dev/zero is refused, not read)
    missing = [key for key in _CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: not a bert_config.json?")
    return config


def _read_vocab(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file not found: {path}")
    # Split on "\n" only, as Google's load_vocab reads lines: str.splitlines() would also split
    # inside tokens holding \x1c, \x85, \u2028 ...
    text = path.read_text(encoding="utf-8")
    return [line.strip() for line in text.removesuffix("\n").split("\n")]


def _guess_do_lower_case(model_name: str, vocab: list[str]) -> bool:
    """Whether the model was trained on lower-cased text, as Google's validate_case_matches_checkpoint
    tells from the directory name (uncased_L-12_H-768_A-12, cased_L-12_H-768_A-12, ...); for any
    other name, from the vocabulary: lower-cased if no token but the [CLS]-like specials has an
    upper-case letter."""
    if "uncased_" in model_name or model_name in _LOWER_CASED_MODELS:
        return True
    if "cased_" in model_name:
        return False
    return not any(
        char.isupper() for token in vocab if not (token.startswith("[") and token.endswith("]")) for char in token
    )


def _some(names: list[str], shown: int = 5) -> str:
    """The first few of a long list of variable names, for an error message."""
    return ", ".join(map(repr, names[:shown])) + (f" ... ({len(names)} in all)" if len(names) > shown else "")


def _write_json(path: Path, content: dict) -> None:
    write_text_atomic(path, json.dumps(content, indent=2) + "\n")


def convert_tf_checkpoint(
    ckpt_prefix: str | os.PathLike,
    output_dir: str | os.PathLike,
    config_file: str | None = None,
    vocab_file: str | None = None,
) -> Path:
    """Convert one of Google's TF1 BERT checkpoints to a directory that bertforge and transformers load.

    ckpt_prefix: `.../bert_model.ckpt` (the path without `.index`), its `.index` file, or a
    directory holding one checkpoint. config_file, vocab_file: default to `bert_config.json` and
    `vocab.txt` beside the checkpoint.

    Writes to output_dir (created if missing) `config.json` (Hugging Face's BERT config, with
    `architectures` from the heads found: BertForPreTraining for run_pretraining.py checkpoints,
    BertForSequenceClassification for run_classifier.py's, BertForQuestionAnswering for
    run_squad.py's), `model.safetensors` (float32, kernels transposed to [out, in], no optimizer
    state, no MLM decoder weight as it is tied to the word embeddings), `vocab.txt` and
    `tokenizer_config.json`. Returns output_dir.

    Raises FileNotFoundError naming a missing file, ValueError for a corrupted checkpoint, an
    unknown variable, a missing one, or a shape that disagrees with the config.
    """
    bundle = _Bundle(ckpt_prefix)
    config_path = Path(config_file) if config_file else bundle.prefix.parent / "bert_config.json"
    vocab_path = Path(vocab_file) if vocab_file else bundle.prefix.parent / "vocab.txt"
    config = _read_config(config_path)
    vocab = _read_vocab(vocab_path)
    if len(vocab) > config["vocab_size"]:
        raise ValueError(
            f"{vocab_path} has {len(vocab)} tokens but {config_path} says vocab_size={config['vocab_size']}"
        )

    names = {tf_name: hf_name for tf_name in bundle.entries if (hf_name := map_tf_name(tf_name)) is not None}
    heads = {_head_of(tf_name) for tf_name in names}
    classifier = bundle.entries.get("output_weights")
    num_labels = classifier.shape[0] if classifier is not None and classifier.shape else 0
    expected = _expected_shapes(config, heads, num_labels)
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        layers = config["num_hidden_layers"]
        raise ValueError(f"variables {_some(unexpected)} do not fit {config_path} (num_hidden_layers={layers})")
    missing = sorted(set(expected) - set(names))
    if missing:
        raise ValueError(f"the checkpoint lacks {_some(missing)}")
    for tf_name, shape in expected.items():
        found = bundle.entries[tf_name].shape
        if found != shape:
            raise ValueError(f"tensor {tf_name!r} has shape {list(found)}, but {config_path} implies {list(shape)}")

    tensors = {}
    for tf_name in tqdm(sorted(names), desc="Converting", unit="tensor", disable=len(names) < 100, leave=False):
        array = bundle.read(tf_name)
        tensors[names[tf_name]] = np.ascontiguousarray(
            array.T if tf_name.endswith("/kernel") else array, dtype=np.float32
        )

    architecture = next(arch for needs, arch in _ARCHITECTURES if needs <= heads)
    hf_config = {
        "architectures": [architecture],
        "model_type": "bert",
        **config,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }
    if "classifier" in heads:
        hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        hf_config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    tokenizer_config = {
        "do_lower_case": _guess_do_lower_case(bundle.prefix.parent.name, vocab),
        "tokenizer_class": "BertTokenizer",
        "model_max_length": config["max_position_embeddings"],
    }

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors", prefix=".model.") as temporary:
        save_file(tensors, temporary, metadata={"format": "pt"})
    _write_json(out / "config.json", hf_config)
    with atomic_path(out / "vocab.txt") as temporary:
        shutil.copyfile(vocab_path, temporary)
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    return out
