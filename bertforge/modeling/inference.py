"""Faster inference for a loaded model: unpadded execution, bf16/fp16 weights, int8 linear layers, torch.compile.

    from bertforge.modeling import BertForSequenceClassification, optimize_for_inference

    model = BertForSequenceClassification.from_pretrained(directory)
    optimize_for_inference(model, dtype="int8")          # in place; also returns the model
    logits = model(**batch).logits                       # same calls, same output shapes

What each option changes, and why it is faster (shapes: B batch, S padded length, T real tokens,
H hidden):

- `unpad=True` (default): the encoder computes the T real tokens instead of all B·S positions
  (`bertforge.modeling.packing.Packing`); outputs keep their (B, S, ...) shapes, padding positions
  hold zeros. Exact to float rounding (≤ 1e-5 in fp32 on all-MiniLM-L6-v2).
- fp32 on CPU: the matmuls run in oneDNN (`kernels.onednn_linear_op`), the feed-forward's GELU fused
  into its first one, and attention over sentence lengths as plain matmuls (`attention.py`): faster
  than the BLAS here, within 1e-5 of the peer's outputs; BERTFORGE_ONEDNN_LINEAR=0 gives the BLAS
  path, bit for bit the peer's.
- `row_bucket` (with unpad; default 16 on CPU, every dtype, 0 on GPUs): T is rounded up to one of a
  few lengths (`bertforge.modeling.packing.bucket_size`, which says why: ≤ 1/8 more rows) with filler
  rows that attend to nothing and are dropped. Real workloads (a server's micro-batches, one pass over
  a file) have a new T nearly every batch: on such batches buckets make int8 and bf16 faster and keep
  every dtype's memory bounded (see docs/results/inference/README.md). With buckets a batch without padding is packed as
  well, and in bf16/fp16 each example's attention runs at a bucketed length (masked). Outputs are
  unchanged (the filler rows are never read).
- `dtype="bf16"`: weights and activations in bfloat16; on a CPU with AVX-512 BF16 or AMX the
  matmuls run faster than in float32 (BENCHMARKS.md, "Inference on real-length batches"). Outputs are bfloat16 (~3 significant digits).
- `dtype="fp16"` / `"bf16"` on a GPU: half-precision weights for the tensor cores.
- `dtype="int8"` (CPU): dynamic quantization of the encoder's linear layers (`Int8Linear`): int8
  weights per output channel, activations quantized per call from their range, int32 accumulation,
  float32 out. The task head's own small layer, the embeddings, LayerNorm and attention stay float32.
  `quantized_engine` picks whose int8 kernels run: by default oneDNN's on CPUs with AMX int8 units
  (recent Xeons) and on AMD CPUs with AVX-512 VNNI, where they were measured faster than FBGEMM's,
  torch's default ("x86"), used elsewhere (`default_quantized_engine`).
- `compile=True`: `torch.compile` of the per-token parts of each layer (feed-forward and the two
  Add & Norm blocks, with dynamic shapes so that every T reuses one graph), fusing bias, GELU,
  residual add and LayerNorm. Off by default because it did not help where measured on a CPU
  (MiniLM, unpadded SST-2 batches): fp32 ran at the eager speed and bf16 slower, after seconds of
  compilation, because the matmuls, which Inductor leaves to the same BLAS/oneDNN kernels, take
  most of the time. It may pay off on GPUs.

The model is changed in place and is meant for inference only (eval mode, no training). An int8
model's `state_dict()` lacks the quantized weights (they live in packed kernel objects) and compile
renames its keys: save checkpoints from an unoptimized model.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import torch
from torch import nn

from .bert import BertModel, FeedForwardExpansion, MultiHeadSelfAttention, ResidualLayerNorm
from .kernels import Linear, PackedWeight, _onednn_bf16, onednn_linear_op
from .packing import DEFAULT_ROW_BUCKET  # noqa: F401 (re-exported: tests and serving import it from here)

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
    "int8": torch.qint8,
}


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W in int8 (one scale per output row) and x quantized to 8 bits per call.

    x (..., in_features) float32 -> (..., out_features) float32. The matmul is torch's dynamic
    quantized linear kernel (FBGEMM/oneDNN on x86: int8 products, int32 sums), what
    `torch.ao.quantization.quantize_dynamic` installs, called directly: that API is deprecated in
    torch 2.13 and matches modules by exact type, so it would skip bertforge's `Linear` and cannot
    see the fused QKV weight. Per-channel weight scales keep the rows with small weights accurate.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, reduce_range: bool | None = None,
                 engine: str | None = None):
        """weight (out_features, in_features), bias (out_features,), float; copied, not kept.

        `reduce_range`: quantize activations to 7 bits instead of 8, as torch's default x86
        configuration does, so that the int8 × uint8 pair sums cannot saturate in 16 bits on CPUs
        without VNNI instructions. None: only where the CPU lacks VNNI (`cpu_has_vnni`). It costs
        accuracy: on all-MiniLM-L6-v2 (SST-2 sentences) the largest hidden-state error is ~1.0 with
        7 bits against ~0.5 with 8.

        `engine`: torch's quantized engine whose kernel this layer uses ("x86", "fbgemm", "onednn";
        see `torch.backends.quantized.supported_engines`). The weights are packed for it here and
        the packed object keeps its kernel, whatever the global engine is later. None:
        `default_quantized_engine()` (oneDNN on CPUs with AMX and AMD CPUs with AVX-512 VNNI, else
        torch's current engine: "x86", FBGEMM, by default).
        """
        super().__init__()
        weight = weight.detach().float().contiguous()
        self.out_features, self.in_features = weight.shape
        self.reduce_range = not cpu_has_vnni() if reduce_range is None else reduce_range
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()  # symmetric, per row
        zero_points = torch.zeros(weight.shape[0], dtype=torch.int64)
        with warnings.catch_warnings(), using_quantized_engine(engine or default_quantized_engine()):
            warnings.simplefilter("ignore")  # quantized tensors are deprecated as a user API, not the kernel
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(
                qweight, None if bias is None else bias.detach().float().contiguous())
            self.engine = torch.backends.quantized.engine

    @classmethod
    def from_linear(cls, linear: nn.Linear, reduce_range: bool | None = None, engine: str | None = None) -> Int8Linear:
        return cls(linear.weight, linear.bias, reduce_range, engine)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype != torch.float32:
            raise TypeError(f"Int8Linear takes float32 input, got {input.dtype}")
        return torch.ops.quantized.linear_dynamic(input.contiguous(), self._packed, self.reduce_range)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel weights, "
                f"engine={self.engine}")


@contextlib.contextmanager
def using_quantized_engine(engine: str | None):
    """Set `torch.backends.quantized.engine` to `engine` (None: leave it) for the block, then restore it."""
    if engine is None:
        yield
        return
    supported = torch.backends.quantized.supported_engines
    if engine not in supported:
        raise ValueError(f"quantized engine {engine!r} is not available in this torch build; "
                         f"choose one of {', '.join(e for e in supported if e != 'none')}")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where that cannot be read)."""
    return _cpu_info()[1]


def _cpu_vendor() -> str:
    """The CPU's vendor_id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD"; "" where unknown)."""
    return _cpu_info()[0]


def _cpu_info() -> tuple[str, frozenset[str]]:
    global _INFO
    if _INFO is None:
        vendor, flags = "", frozenset()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as file:
                for line in file:
                    if line.startswith("vendor_id") and not vendor:
                        vendor = line.split(":", 1)[1].strip()
                    elif line.startswith("flags"):
                        flags = frozenset(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        _INFO = (vendor, flags)
    return _INFO


_INFO: tuple[str, frozenset[str]] | None = None


def cpu_has_vnni() -> bool:
    """Whether this CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX), from
    /proc/cpuinfo; False where that cannot be read (the safe answer: 7-bit activations)."""
    return any(flag in _cpu_flags() for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


def default_quantized_engine() -> str:
    """The engine `Int8Linear` packs for when none is named: "onednn" where its int8 kernels were
    measured faster than FBGEMM's on BERT's batches, CPUs with AMX int8 units (an Intel Xeon) and AMD
    CPUs with AVX-512 VNNI (BENCHMARKS.md, "Inference against the peer at its best settings"), else
    torch's current `torch.backends.quantized.engine`."""
    flags = _cpu_flags()
    faster = "amx_int8" in flags or (_cpu_vendor() == "AuthenticAMD" and "avx512_vnni" in flags)
    if faster and "onednn" in torch.backends.quantized.supported_engines:
        return "onednn"
    return torch.backends.quantized.engine


def _encoders(model: nn.Module) -> list[BertModel]:
    encoders = [module for module in model.modules() if isinstance(module, BertModel)]
    if not encoders:
        raise TypeError(f"optimize_for_inference takes a bertforge BertModel or a head class holding one, "
                        f"got {type(model).__name__}")
    return encoders


def _is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, Int8Linear) for module in model.modules())


def _device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def default_row_bucket(model: nn.Module) -> int:
    """The unpadded path's bucket step for `model` as it is now: DEFAULT_ROW_BUCKET on CPU, every
    dtype (why: `bertforge.modeling.packing`), else 0 (exact packing)."""
    return DEFAULT_ROW_BUCKET if _device_of(model).type == "cpu" else 0


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bfloat16 matmuls (AVX-512 BF16 or AMX), per oneDNN."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def _cast(model: nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers to `dtype`, then lay Q, K, V out side by side again:
    `.to(dtype)` re-allocates each parameter, which would make every forward pass concatenate the
    (3H, H) QKV weight (see MultiHeadSelfAttention._share_qkv_storage)."""
    model.to(dtype)
    for module in model.modules():
        if isinstance(module, MultiHeadSelfAttention) and module.qkv is None:
            module._share_qkv_storage()


def quantize_int8(encoder: BertModel, reduce_range: bool | None = None, engine: str | None = None) -> None:
    """Replace the linear layers of `encoder`'s layers and pooler by `Int8Linear`, in place (CPU, float32).

    Per layer: the fused (3H, H) QKV projection (one matrix, one kernel call; query/key/value become
    None), the attention output (H, H), the feed-forward (4H, H) and (H, 4H). Layers already
    quantized are left as they are. `engine`: see `Int8Linear`.
    """
    for layer in encoder.encoder.layer:
        attention = layer.attention.self
        if attention.qkv is None:
            attention.qkv = Int8Linear(attention._fused("weight"), attention._fused("bias"), reduce_range, engine)
            attention.query = attention.key = attention.value = None
        for owner in (layer.attention.output, layer.intermediate, layer.output):
            if not isinstance(owner.dense, Int8Linear):
                owner.dense = Int8Linear.from_linear(owner.dense, reduce_range, engine)
    if encoder.pooler is not None and not isinstance(encoder.pooler.dense, Int8Linear):
        encoder.pooler.dense = Int8Linear.from_linear(encoder.pooler.dense, reduce_range, engine)


def _compile_layers(encoder: BertModel) -> None:
    """torch.compile the shape-agnostic, per-token parts of every layer, with dynamic shapes.

    Attention stays eager: the packed plan loops over groups of examples in Python. Compiled
    submodules are wrapped (a different type), which turns off the CPU inference plan's reused buffers
    (`BertModel._inference_fast_path`), which Inductor's fused kernels make unnecessary.
    """
    for layer in encoder.encoder.layer:
        for owner, name in ((layer.attention, "output"), (layer, "intermediate"), (layer, "output")):
            module = getattr(owner, name)
            if isinstance(module, (FeedForwardExpansion, ResidualLayerNorm)):
                setattr(owner, name, torch.compile(module, dynamic=True))


def trained_for(config) -> str:
    """What a checkpoint was trained for, in words: its `finetuning_task` (written by `bertforge finetune`),
    else its first `architectures` entry, else "a pre-trained encoder"."""
    task = config.extra.get("finetuning_task")
    if task:
        return f"a {task} model"
    architectures = config.extra.get("architectures") or []
    return f"a {architectures[0]} checkpoint" if architectures else "a pre-trained encoder"


# Checkpoints whose head serves another head class as it is: pre-training's MLM head is the MLM head.
_SAME_HEAD = {"BertForMaskedLM": ("BertForMaskedLM", "BertForPreTraining")}


def require_trained_head(model: nn.Module, directory: str | os.PathLike, task: str,
                         ignore: tuple[str, ...] = ()) -> None:
    """Refuse to predict with weights `from_pretrained` had to initialise (its `load_report`).

    A checkpoint fine-tuned for one task, loaded into another task's head class, gets a random head:
    its outputs look like answers (a span, a label with a probability) but mean nothing. `ignore`:
    key prefixes the caller does not run (e.g. the pooler, for hidden states). A head class other than
    the one config.json's `architectures` names is refused too: some heads share weight names. ValueError
    naming the model directory, what it was trained for and the missing weights or the saved class.
    """
    report = getattr(model, "load_report", None)
    missing = [k for k in (report.newly_initialized if report else []) if not k.startswith(ignore)]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(f"{directory} is {trained_for(model.config)}, not trained for {task}: its "
                         f"{type(model).__name__} weights {shown} are not in the checkpoint (they would be random); "
                         f"fine-tune it for {task} first")
    # Some heads share weight names (a sequence classifier's `classifier.*` loads into a token
    # classifier without a missing key): the head class the checkpoint was saved from decides too.
    wanted = type(model).__name__
    saved = (model.config.extra.get("architectures") or [None])[0]
    if wanted != "BertModel" and isinstance(saved, str) and saved.startswith("BertFor") \
            and saved not in _SAME_HEAD.get(wanted, (wanted,)):
        raise ValueError(f"{directory} is {trained_for(model.config)}, not trained for {task}: its config.json "
                         f"says {saved}, not {wanted}; fine-tune it for {task} first")


def load_for_inference(model_class: type[nn.Module], directory: str | os.PathLike, dtype: str | None = None,
                       *, task: str | None = None, **kwargs: Any) -> nn.Module:
    """`model_class.from_pretrained(directory, **kwargs)`, then, when `dtype` is given, made faster with
    `optimize_for_inference(model, dtype=dtype)` (unpadded; "fp32" exact, "bf16"/"int8" approximate).
    None: the model as saved, in eval mode. What `bertforge predict --dtype` loads models with.
    A checkpoint that lacks weights of `model_class` (a head trained for another task, or none) is a
    ValueError (`require_trained_head`; `task` names what was asked in the message)."""
    model = model_class.from_pretrained(directory, **kwargs).eval()
    require_trained_head(model, directory, task or model_class.__name__)
    return model if dtype is None else optimize_for_inference(model, dtype=dtype)


def optimize_for_inference(model: nn.Module, dtype: str = "fp32", unpad: bool = True,
                           compile: bool = False, quantized_engine: str | None = None,
                           row_bucket: int | None = None) -> nn.Module:
    """Make `model` (a BertModel or a head class) faster for inference, in place; returns it.

    Inputs and output shapes do not change: call the model as before, e.g.
    `model(input_ids, token_type_ids, attention_mask)` with (B, S) tensors.

    dtype: "fp32" (exact), "bf16" (CPU with AVX-512 BF16/AMX, or GPU), "fp16" (GPU only), "int8"
      (CPU only: `quantize_int8`). Outputs are bf16/fp16 for those dtypes, float32 for int8.
    unpad: run the encoder on the real tokens only (`BertModel.unpad`); exact, see `Packing`.
    row_bucket: with unpad, round the packed length up to a few sizes (`Packing`; 0: exactly T);
      None: `default_row_bucket(model)` once converted (16 on CPU, 0 on GPUs).
    compile: torch.compile the per-token parts of each layer (fp32/bf16/fp16; not with int8).
    quantized_engine: with int8, the kernels' engine (see `Int8Linear`); None: `default_quantized_engine()`.

    Sets eval mode. The model must not be trained afterwards; int8 and compile change its state_dict.
    """
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(sorted(DTYPES))}; got {dtype!r}")
    if not isinstance(unpad, bool):
        raise TypeError(f"unpad must be True or False, got {unpad!r}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    if row_bucket is not None and (not isinstance(row_bucket, int) or isinstance(row_bucket, bool)
                                   or row_bucket < 0):
        raise ValueError(f"row_bucket must be an int >= 0 or None, got {row_bucket!r}")
    target = DTYPES[dtype.lower()]
    encoders = _encoders(model)
    device = _device_of(model)
    quantized = _is_quantized(model)
    if quantized and target != torch.qint8:
        raise ValueError(f"the model's linear layers are already int8; dtype={dtype!r} cannot undo that: "
                         "load the checkpoint again")
    if target == torch.qint8:
        if device.type != "cpu":
            raise ValueError(f"int8 dynamic quantization runs on CPU only; the model is on {device}: "
                             "use dtype='fp16' or 'bf16' on a GPU")
        if compile:
            raise ValueError("compile=True is not supported with dtype='int8' (quantized kernels are "
                             "opaque to torch.compile); use one or the other")
    elif quantized_engine is not None:
        raise ValueError(f"quantized_engine={quantized_engine!r} applies to dtype='int8' only; got dtype={dtype!r}")
    if target == torch.float16 and device.type == "cpu":
        raise ValueError("dtype='fp16' is for GPUs (CPUs have no fast float16 matmul); on CPU use 'bf16' or 'int8'")
    if target == torch.bfloat16 and device.type == "cpu" and not cpu_has_bf16():
        warnings.warn("this CPU has no native bfloat16 matmul (AVX-512 BF16 or AMX): dtype='bf16' will "
                      "be slower than fp32", RuntimeWarning, stacklevel=2)

    model.eval()
    if target == torch.qint8:
        if any(p.dtype != torch.float32 for p in model.parameters()):
            _cast(model, torch.float32)
        for encoder in encoders:
            quantize_int8(encoder, engine=quantized_engine)
    elif any(p.is_floating_point() and p.dtype != target for p in model.parameters()):
        _cast(model, target)
    if row_bucket is None:
        row_bucket = default_row_bucket(model)
    pack = (device.type == "cpu" and not compile and onednn_linear_op() is not None
            and (target == torch.float32 or (target == torch.bfloat16 and _onednn_bf16())))
    for encoder in encoders:
        encoder.unpad = unpad
        encoder.unpad_row_bucket = row_bucket
        _prepack_weights(encoder, pack)
        if compile:
            _compile_layers(encoder)
    return model


def _prepack_weights(encoder: BertModel, pack: bool) -> None:
    """Give each dense layer of `encoder` (the stacked QKV projection, the attention output, the
    expansion and the output) oneDNN's packed copy of its weight (`kernels.PackedWeight`), or with
    `pack` False take any away. Packed where float32/bfloat16 inference runs its matmuls in oneDNN on
    CPU; not with compile (its graphs call the plain kernels) or int8 (other kernels)."""
    for module in encoder.modules():
        if isinstance(module, MultiHeadSelfAttention):
            module.packed_qkv = (PackedWeight(module.query.weight, module.key.weight, module.value.weight)
                                 if pack and module.qkv is None else None)
        elif isinstance(module, Linear):
            module.packed_weight = PackedWeight(module.weight) if pack else None
