"""Regenerate the TensorFlow checkpoint fixtures used by tests/modeling/test_tf_checkpoint.py.

Needs TensorFlow, which is *not* a dependency of bertforge: run it from a throwaway venv,

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu numpy
    /tmp/tfvenv/bin/python scripts/make_tf_fixture.py

It writes two fixtures:

* tests/fixtures/tf_bert_tiny/: a tiny BERT (vocab 99, H=32, L=2, A=4, FFN 37, 64 positions) saved
  the way Google's run_pretraining.py saves one: Google's exact variable names, an `adam_m` and an
  `adam_v` slot per variable and `global_step`, with `bert_config.json` and `vocab.txt`.
  `expected.npz` holds every checkpoint variable (keyed by its TF name) and the outputs of a
  faithful TF re-implementation of Google's modeling.py forward pass on a small padded batch.
* tests/fixtures/tf_dtypes_sharded/: a few tensors of every dtype the reader supports, placed on two
  devices so that the sharded Saver writes two data files; `expected.npz` holds their values.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"

CONFIG = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "type_vocab_size": 2,
    "vocab_size": 99,
}

# [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then lower-case pieces: an uncased vocabulary.
WORDS = "the of and to in is was he for it with as his on be at by you this had not are but from or".split()
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + LETTERS + ["##" + c for c in LETTERS]
VOCAB += [f"##{w}" for w in WORDS][: CONFIG["vocab_size"] - len(VOCAB)]

# Two sequences: [CLS] A [SEP] B [SEP], the second padded after 5 tokens.
INPUT_IDS = np.array(
    [[2, 5, 31, 62, 3, 9, 17, 3], [2, 44, 70, 3, 12, 0, 0, 0]],
    dtype=np.int32,
)
TOKEN_TYPE_IDS = np.array([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 0, 0, 0]], dtype=np.int32)
INPUT_MASK = np.array([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0]], dtype=np.int32)


def tiny_bert() -> None:
    out = ROOT / "tf_bert_tiny"
    out.mkdir(parents=True, exist_ok=True)
    assert len(VOCAB) == CONFIG["vocab_size"] and len(set(VOCAB)) == len(VOCAB)
    (out / "vocab.txt").write_text("".join(token + "\n" for token in VOCAB))
    (out / "bert_config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")

    H, V, FFN = CONFIG["hidden_size"], CONFIG["vocab_size"], CONFIG["intermediate_size"]
    A, P, T = CONFIG["num_attention_heads"], CONFIG["max_position_embeddings"], CONFIG["type_vocab_size"]
    rng = np.random.default_rng(20181011)  # BERT's arXiv date
    values: dict[str, np.ndarray] = {}

    def var(name: str, shape: tuple[int, ...], kind: str = "weight") -> tf.Variable:
        # O(1) activations (not BERT's 0.02 init) so that a wrong mapping shows in the outputs.
        if kind == "gamma":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif kind == "bias":
            value = 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / math.sqrt(shape[0])
        values[name] = value.astype(np.float32)
        return tf1.Variable(values[name], name=name)

    def dense(x, scope: str, n_in: int, n_out: int, activation=None):
        y = tf.matmul(x, var(f"{scope}/kernel", (n_in, n_out))) + var(f"{scope}/bias", (n_out,), "bias")
        return activation(y) if activation else y

    def layer_norm(x, scope: str):
        # tf.contrib.layers.layer_norm over the last axis, as modeling.py, with epsilon 1e-12.
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return tf.nn.batch_normalization(
            x, mean, variance, var(f"{scope}/beta", (H,), "bias"), var(f"{scope}/gamma", (H,), "gamma"), 1e-12
        )

    def gelu(x):
        return x * 0.5 * (1.0 + tf.math.erf(x / math.sqrt(2.0)))

    input_ids = tf1.placeholder(tf.int32, INPUT_IDS.shape)
    token_type_ids = tf1.placeholder(tf.int32, INPUT_IDS.shape)
    input_mask = tf1.placeholder(tf.int32, INPUT_IDS.shape)
    B, S = INPUT_IDS.shape

    # embedding_lookup + embedding_postprocessor: segment embeddings by one-hot matmul, positions sliced.
    word_embeddings = var("bert/embeddings/word_embeddings", (V, H))
    x = tf.gather(word_embeddings, input_ids)
    token_type_table = var("bert/embeddings/token_type_embeddings", (T, H))
    x += tf.reshape(tf.matmul(tf.one_hot(tf.reshape(token_type_ids, [-1]), T), token_type_table), [B, S, H])
    x += var("bert/embeddings/position_embeddings", (P, H))[:S][None]
    x = layer_norm(x, "bert/embeddings/LayerNorm")

    # create_attention_mask_from_input_mask + the -10000 adder of attention_layer.
    adder = (1.0 - tf.cast(input_mask[:, None, None, :], tf.float32)) * -10000.0
    D = H // A
    for n in range(CONFIG["num_hidden_layers"]):
        prefix = f"bert/encoder/layer_{n}"

        def heads(t):
            return tf.transpose(tf.reshape(t, [B, S, A, D]), [0, 2, 1, 3])

        q = heads(dense(x, f"{prefix}/attention/self/query", H, H))
        k = heads(dense(x, f"{prefix}/attention/self/key", H, H))
        v = heads(dense(x, f"{prefix}/attention/self/value", H, H))
        probs = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(D) + adder)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [B, S, H])
        attention = layer_norm(
            dense(context, f"{prefix}/attention/output/dense", H, H) + x, f"{prefix}/attention/output/LayerNorm"
        )
        intermediate = dense(attention, f"{prefix}/intermediate/dense", H, FFN, gelu)
        x = layer_norm(dense(intermediate, f"{prefix}/output/dense", FFN, H) + attention, f"{prefix}/output/LayerNorm")
    sequence_output = x
    pooled_output = dense(sequence_output[:, 0], "bert/pooler/dense", H, H, tf.tanh)

    # run_pretraining.py's get_masked_lm_output (on every position) and get_next_sentence_output.
    transformed = layer_norm(
        dense(sequence_output, "cls/predictions/transform/dense", H, H, gelu), "cls/predictions/transform/LayerNorm"
    )
    output_bias = var("cls/predictions/output_bias", (V,), "bias")
    mlm_logits = tf.einsum("bsh,vh->bsv", transformed, word_embeddings) + output_bias
    nsp_weights = var("cls/seq_relationship/output_weights", (2, H))  # [out, in], unlike the kernels
    nsp_bias = var("cls/seq_relationship/output_bias", (2,), "bias")
    nsp_logits = tf.matmul(pooled_output, nsp_weights, transpose_b=True) + nsp_bias

    # The optimizer state run_pretraining.py checkpoints carry (optimization.py's AdamWeightDecay
    # slots and the global step), zero as right after initialisation: the converter only has to
    # recognise and skip them, and zeros cost next to nothing in git.
    model_names = sorted(values)
    for name in model_names:
        for slot in ("adam_m", "adam_v"):
            values[f"{name}/{slot}"] = np.zeros_like(values[name])
            tf1.Variable(values[f"{name}/{slot}"], name=f"{name}/{slot}")
    tf1.train.get_or_create_global_step()
    values["global_step"] = np.array(0, np.int64)

    saver = tf1.train.Saver()
    with tf1.Session() as session:
        session.run(tf1.global_variables_initializer())
        saved = {v.op.name for v in tf1.global_variables()}
        assert saved == set(values), saved ^ set(values)
        outputs = session.run(
            {
                "sequence_output": sequence_output,
                "pooled_output": pooled_output,
                "mlm_logits": mlm_logits,
                "nsp_logits": nsp_logits,
            },
            {input_ids: INPUT_IDS, token_type_ids: TOKEN_TYPE_IDS, input_mask: INPUT_MASK},
        )
        saver.save(session, str(out / "bert_model.ckpt"), write_meta_graph=False, write_state=False)

    np.savez_compressed(
        out / "expected.npz",
        input_ids=INPUT_IDS,
        token_type_ids=TOKEN_TYPE_IDS,
        input_mask=INPUT_MASK,
        **outputs,
        **{f"var:{name}": value for name, value in values.items()},
    )


def dtypes_sharded() -> None:
    out = ROOT / "tf_dtypes_sharded"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    values = {
        "shard0/float32": rng.standard_normal((3, 4)).astype(np.float32),
        "shard0/float16": rng.standard_normal((5,)).astype(np.float16),
        "shard0/int64_scalar": np.array(123456789012, np.int64),
        "shard1/int32": rng.integers(-1000, 1000, (2, 3, 2)).astype(np.int32),
        "shard1/bfloat16": rng.standard_normal((2, 3)).astype(np.float32),
        "shard1/empty": np.zeros((0, 3), np.float32),
    }
    with tf.Graph().as_default():
        for name, value in values.items():
            with tf.device("/cpu:0" if name.startswith("shard0") else "/cpu:1"):
                dtype = tf.bfloat16 if name.endswith("bfloat16") else None
                tf1.Variable(tf.constant(value, dtype=dtype), name=name)
        saver = tf1.train.Saver(sharded=True)
        with tf1.Session(config=tf1.ConfigProto(device_count={"CPU": 2})) as session:
            session.run(tf1.global_variables_initializer())
            read = session.run(
                {
                    v.op.name: tf.cast(v, tf.float32) if v.dtype.base_dtype == tf.bfloat16 else v
                    for v in tf1.global_variables()
                }
            )
            saver.save(session, str(out / "tensors.ckpt"), write_meta_graph=False, write_state=False)
    # bfloat16 keeps 8 mantissa bits: store what TF actually saved, widened to float32.
    values["shard1/bfloat16"] = read["shard1/bfloat16"]
    np.savez_compressed(out / "expected.npz", **values)


if __name__ == "__main__":
    print("TensorFlow", tf.__version__)
    tiny_bert()
    dtypes_sharded()
    for path in sorted(ROOT.glob("tf_*/*")):
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")
