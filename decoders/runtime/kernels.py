"""Pre-packed float32 matmuls for CPU: the one model-runtime optimization SpecLab makes.

Why: on CPU, `nn.Linear` calls MKL's sgemm, which re-lays-out (packs) the whole weight matrix on every call that
has more than one input row. Decoding reads every weight once per forward anyway, so for a speculative
verification forward over n = 2…20 tokens the repacking roughly doubles or triples the time of a one-token
step, which is exactly what speculative decoding needs to be cheap (t(n) ≈ 1). oneDNN can lay the weight out
once, at load time, in its own blocked format; its kernels then read that layout directly for any row count.
Measured on this project's 2-core AVX2 EPYC (bench/OPTIMIZATIONS.md): Qwen2.5-Coder-1.5B float32 one-token step
369 → 300 ms, 13-token verification 1084 → 639 ms; the 0.5B draft step 170 → 107 ms.

Exactness: the packed kernel computes the same float32 products with a different summation order, so logits move
by ~1e-5 (argmax unchanged in every check we ran). Greedy speculative output still equals the greedy baseline
*run on the same kernels*; the equivalence tests check that on packed tiny models.

Packing replaces each `nn.Linear` in place by a `PackedLinear` that holds the packed copy and drops the dense
weight (memory-neutral) unless that weight is shared (tied embeddings), which stays where it is. `unpack`
restores ordinary `nn.Linear` modules with bit-identical weights (the benchmark runs Hugging Face's own
`generate` on those, as users would).

On a GPU the same verbs fuse instead of pack: there a small model's step is bound by how many kernels it launches,
and `pack` swaps transformers' norms, attention and MLPs for decoders/runtime/fused.py's stand-ins (fewer, bigger kernels,
the same weights, float32 only; `unpack` puts the stock modules back).
"""
from __future__ import annotations

import torch
from torch import nn

from . import fused

PACKED, STOCK, INT8 = "packed", "stock", "int8"


def packing_available(model: nn.Module) -> bool:
    """Only float32 on CPU, and only where this torch build has oneDNN's packed-linear ops."""
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    return (parameter.device.type == "cpu" and parameter.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """y = x Wᵀ + b with W held in oneDNN's blocked layout (packed once)."""

    def __init__(self, linear: nn.Linear, keep_dense: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)  # (out, in) blocked
        self.bias = linear.bias  # (out,) or None: stays a Parameter
        self.dense = linear.weight if keep_dense else None  # a tied weight lives on in its other owner anyway

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # (..., out)

    def __deepcopy__(self, memo) -> "PackedLinear":
        """A packed weight is an opaque oneDNN tensor that copy.deepcopy cannot copy: re-pack a copy of the dense one."""
        import copy

        return PackedLinear(copy.deepcopy(self.to_linear(), memo), keep_dense=self.dense is not None)

    def to_linear(self) -> nn.Linear:
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.dense if self.dense is not None else nn.Parameter(self.packed.to_dense(), requires_grad=False)
        linear.weight = weight  # bit-identical to the weight that was packed
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def fusing_available(model: nn.Module) -> bool:
    """float32 on a GPU: there the stand-ins of decoders/runtime/fused.py launch fewer kernels (PyTorch's fused RMSNorm is
    CUDA's)."""
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    return parameter.device.type == "cuda" and parameter.dtype == torch.float32


def kernels_of(model: nn.Module) -> str:
    if fused.is_fused(model) or any(isinstance(m, PackedLinear) for m in model.modules()):
        return PACKED
    return INT8 if any(is_int8(m) for m in model.modules()) else STOCK


def quantize_int8(model: nn.Module) -> int:
    """A draft's linears as int8 (per output channel), each token's activations quantized on their own (Int8Linear).

    For drafts only: a draft's precision changes q, never the target's p, so verification stays exact while the
    draft step gets cheaper where the CPU has int8 dot products (decoders/quantize.py decides where it pays).
    Returns how many linears were converted."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    unpack(model)  # from oneDNN's packed layout back to nn.Linear, which is what quantize_dynamic converts
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    with warnings.catch_warnings():  # torch.ao's eager quantization announces its move to torchao: still supported
        warnings.simplefilter("ignore")
        quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
        _swap_int8(model)
    return before - sum(type(m) is nn.Linear for m in model.modules())


# Each token's activations, mapped onto [-1, 1], are quantized to 0..126 with this fixed scale and zero point: 7 bits,
# as fbgemm's own dynamic linear uses on x86 (reduce_range: 8-bit activations can saturate AVX2's int16 products).
UNIT_SCALE, UNIT_ZERO = 1 / 63, 63


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W int8 per output channel and x quantized per token, on fbgemm's int8 kernel.

    Why per token: fbgemm's dynamic linear picks one activation range per call, over every row it is given, so in a
    batch (decoders/batch) row r's q depended on the other rows and on the pad slots (the review measured 0.39 on
    outputs of ~1 for one 16x16 linear), and a sampled batch row no longer drew what it draws alone. Here each token
    x is first mapped affinely onto [-1, 1] by its own min and max, x = mid + half·x', then quantized with one fixed
    scale (UNIT_SCALE), so no row's quantization reads another row; W x = half·(W x') + mid·(W 1), with W 1 the
    dequantized weight's row sums. A token keeps the 7-bit resolution over its own [min, max] that a one-token call
    had, and a row's output is bit-identical batched or alone (integer accumulation; tests/test_quantize.py). Cost:
    the affine map in and out, a few elementwise passes per linear (timed in the report of issue 33)."""

    def __init__(self, dynamic: nn.Module):
        super().__init__()
        from torch.ao.nn.quantized.modules.linear import LinearPackedParams

        weight, bias = dynamic.weight(), dynamic.bias()  # qint8 (out, in) per channel; float (out,) or None
        self.in_features, self.out_features = dynamic.in_features, dynamic.out_features
        self.params = LinearPackedParams(dtype=torch.qint8)
        self.params.set_weight_bias(weight, None)  # the bias is added after the affine map back
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.register_buffer("row_sums", weight.dequantize().sum(dim=1))  # (out,) = W 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low, high = torch.aminmax(x, dim=-1, keepdim=True)  # (..., 1) each
        half = (high - low).mul_(0.5)  # (..., 1)
        mid = (high + low).mul_(0.5)  # (..., 1)
        unit = (x - mid).div_(half.clamp_min(torch.finfo(x.dtype).tiny))  # (..., in), each row spans [-1, 1]
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            unit, UNIT_SCALE, UNIT_ZERO, self.params._packed_params)  # (..., out) = W x'
        y = y.mul_(half).addcmul_(mid, self.row_sums)  # half·W x' + mid·W 1
        return y.add_(self.bias) if self.bias is not None else y

    def int8_weight(self) -> torch.Tensor:
        return self.params._weight_bias()[0]  # qint8 (out, in)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def is_int8(module: nn.Module) -> bool:
    return isinstance(module, Int8Linear) or type(module).__module__.startswith("torch.ao.nn.quantized.dynamic")


def int8_weight(module: nn.Module) -> torch.Tensor:
    """An int8 linear's weight, dequantized: (out, in) float32, what the model computes with."""
    weight = module.int8_weight() if isinstance(module, Int8Linear) else module.weight()
    return weight.dequantize()


def _swap_int8(model: nn.Module) -> int:
    return _swap(model, _dynamic_linear_type(), Int8Linear)


def _dynamic_linear_type() -> type:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return DynamicLinear


def pack(model: nn.Module) -> int:
    """This device's fast kernels: on a CPU every nn.Linear as a PackedLinear, on a GPU decoders/runtime/fused.py's stand-ins
    for the norms, attention and MLPs (a no-op where neither applies). Returns how many modules were swapped."""
    if fusing_available(model):
        return fused.fuse(model)
    if not packing_available(model):
        return 0
    shared = _shared_weights(model)
    return _swap(model, nn.Linear, lambda linear: PackedLinear(linear, keep_dense=id(linear.weight) in shared))


def own_leftovers(model: nn.Module) -> int:
    """Copy every parameter and buffer into memory of its own (tied ones stay tied). Returns how many were copied.

    Why: from_pretrained maps the safetensors file and the weights are views into that mapping. Once packing (or
    int8) has replaced the linears, the tensors left (embeddings, norms, biases) still view it, and while any view
    lives the whole file stays mapped: the pages of every weight that was packed away stay in the process's resident
    set (measured, Qwen2.5-Coder-1.5B: 6.3 GB of packed weights + 6.0 GB of file pages). Copied, the mapping goes."""
    copies: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            for group in (module._parameters, module._buffers):
                for name, tensor in list(group.items()):
                    if tensor is None:
                        continue
                    if id(tensor) not in copies:  # one copy per object, so tied weights stay one tensor
                        copy = tensor.detach().clone()
                        copies[id(tensor)] = nn.Parameter(copy, requires_grad=False) if isinstance(
                            tensor, nn.Parameter) else copy
                    group[name] = copies[id(tensor)]
    return len(copies)


def unpack(model: nn.Module) -> int:
    """Back to stock nn.Linear modules and transformers' own norms, attention and MLPs, on the original weights.
    Returns how many were swapped."""
    return _swap(model, PackedLinear, PackedLinear.to_linear) + fused.unfuse(model)


def use(model: nn.Module, kernels: str) -> None:
    """Put `model` on `kernels` ("packed" | "stock"); cheap when it already is."""
    if kernels not in (PACKED, STOCK):
        raise ValueError(f"kernels must be {PACKED!r} or {STOCK!r}, got {kernels!r}")
    if kernels_of(model) != kernels:
        pack(model) if kernels == PACKED else unpack(model)


def _shared_weights(model: nn.Module) -> set[int]:
    """ids of Linear weights that another module also holds (tied input/output embeddings)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners[id(parameter)] = owners.get(id(parameter), 0) + 1
    return {pid for pid, count in owners.items() if count > 1}


def _swap(model: nn.Module, kind: type, make) -> int:
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, make(child))
                swapped += 1
    return swapped
