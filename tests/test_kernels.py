"""Packed float32 matmuls (decoders/runtime/kernels.py): same function, reversible, and still lossless.

Packing changes the summation order, not the math: logits must stay within float32 rounding of the stock ones,
unpacking must give back bit-identical weights, tied embeddings must stay tied, and every greedy speculative
method on a packed model must reproduce the greedy baseline on that same packed model token for token.
"""
from __future__ import annotations

import copy

import pytest
import torch

from decoders import DecodeOptions, generate
from decoders.runtime import fused, kernels
from tiny import TinyLM, noisy_copy, tiny_gemma3, tiny_llama, tiny_qwen2

PROMPTS = [[3, 9, 4, 1, 7, 22, 5], [10, 11, 12, 10, 11, 12, 10, 11]]


def packed_copy(lm: TinyLM) -> TinyLM:
    model = copy.deepcopy(lm.model)
    assert kernels.pack(model) > 0
    return TinyLM(model, name=lm.name + "-packed", eos_token_ids=lm.eos_token_ids)


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]  # (n, V)


def test_the_pinned_torch_build_can_pack():
    assert kernels.packing_available(tiny_llama().model)  # else the app silently runs the slower stock kernels


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2, tiny_gemma3])
def test_packed_logits_match_stock_within_float32_rounding(make):
    lm = make()
    packed = packed_copy(lm)
    assert kernels.kernels_of(packed.model) == kernels.PACKED and kernels.kernels_of(lm.model) == kernels.STOCK
    assert not any(type(m) is torch.nn.Linear for m in packed.model.modules())
    for ids in PROMPTS:
        stock, fast = logits(lm.model, ids), logits(packed.model, ids)
        assert torch.allclose(stock, fast, rtol=1e-4, atol=1e-4), (stock - fast).abs().max()


def test_unpack_restores_bit_identical_weights():
    lm = tiny_qwen2()  # q/k/v carry biases
    model = copy.deepcopy(lm.model)
    kernels.pack(model)
    assert kernels.unpack(model) > 0
    assert kernels.kernels_of(model) == kernels.STOCK
    original = dict(lm.model.named_parameters())
    restored = dict(model.named_parameters())
    assert original.keys() == restored.keys()
    for name, value in original.items():
        assert torch.equal(value, restored[name]), name
    assert torch.equal(logits(lm.model, PROMPTS[0]), logits(model, PROMPTS[0]))  # the very same function again


def test_tied_output_embedding_stays_tied():
    lm = tiny_gemma3()  # Gemma 3 ties lm_head to the input embedding
    model = copy.deepcopy(lm.model)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    kernels.pack(model)
    assert model.lm_head.dense is model.get_input_embeddings().weight  # kept, not copied: memory-neutral
    kernels.unpack(model)
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_use_switches_and_rejects_unknown_kernels():
    model = copy.deepcopy(tiny_llama().model)
    kernels.use(model, kernels.PACKED)
    kernels.use(model, kernels.PACKED)  # idempotent
    assert kernels.kernels_of(model) == kernels.PACKED
    kernels.use(model, kernels.STOCK)
    assert kernels.kernels_of(model) == kernels.STOCK
    with pytest.raises(ValueError, match="kernels must be"):
        kernels.use(model, "fast")


def test_half_precision_models_are_left_alone():
    model = copy.deepcopy(tiny_llama().model).to(torch.bfloat16)
    assert kernels.pack(model) == 0
    assert kernels.kernels_of(model) == kernels.STOCK


CASES = [("draft-model", "static", 3), ("draft-model", "adaedl", 4), ("draft-model", "max-confidence", 4),
         ("prompt-lookup", "static", 4), ("layer-skip", "static", 2)]


@pytest.mark.parametrize("drafter,rule,gamma", CASES, ids=[f"{d}-{r}" for d, r, _ in CASES])
def test_speculative_on_packed_models_equals_packed_baseline(drafter, rule, gamma):
    target = packed_copy(tiny_llama(layers=4))
    draft = packed_copy(noisy_copy(tiny_llama(layers=4), noise=0.02)) if drafter == "draft-model" else None
    for prompt in PROMPTS:
        baseline = generate(DecodeOptions(max_new_tokens=40), prompt, target=target).output_ids
        options = DecodeOptions(method="speculative", drafter=drafter, rule=rule, gamma=gamma, max_draft=6,
                                max_new_tokens=40)
        trace = generate(options, prompt, target=target, draft=draft)
        assert trace.output_ids == baseline, prompt
        if drafter == "draft-model":
            assert trace.totals["acceptance_rate"] > 0.3  # the noisy copy is a useful draft: verification really ran


def test_a_packed_model_deep_copies(tiny):
    import copy

    from tiny import tiny_llama

    from decoders.runtime import kernels

    model = tiny_llama(layers=2).model
    kernels.pack(model)
    twin = copy.deepcopy(model)
    assert kernels.kernels_of(twin) == kernels.PACKED
    ids = torch.tensor([[3, 9, 4]])
    assert torch.equal(model(ids).logits, twin(ids).logits)


@pytest.mark.parametrize("make", [tiny_qwen2, tiny_gemma3], ids=["untied", "tied"])
def test_a_packed_model_lets_its_weights_file_go(tmp_path, make):
    """from_pretrained maps the safetensors file; after packing, the leftover views kept the whole file mapped (its
    pages in the resident set: 6 GB for the 1.5B target). own_leftovers copies them, the mapping goes, nothing moves."""
    import gc

    lm = make()
    lm.model.save_pretrained(tmp_path)
    model = type(lm.model).from_pretrained(tmp_path, dtype=torch.float32).eval()

    def mapped() -> int:
        with open("/proc/self/maps") as maps:
            return sum(str(tmp_path) in line for line in maps)

    assert mapped() > 0, "from_pretrained no longer maps the file: this test's premise is gone"
    assert kernels.pack(model) > 0
    packed = logits(model, PROMPTS[0])
    assert kernels.own_leftovers(model) > 0
    gc.collect()
    assert mapped() == 0
    assert torch.equal(logits(model, PROMPTS[0]), packed)
    if model.config.tie_word_embeddings:  # tied weights stay one tensor
        assert model.get_output_embeddings().dense is model.get_input_embeddings().weight


# ---------------------------------------------------------------- a GPU's stand-ins (decoders/runtime/fused.py), run here too

def fused_copy(lm: TinyLM) -> TinyLM:
    model = copy.deepcopy(lm.model)
    kernels.use(model, kernels.STOCK)
    assert fused.fuse(model) == 4 * model.config.num_hidden_layers + 1  # 2 norms, attention, MLP a layer; final norm
    return TinyLM(model, name=lm.name + "-fused", eos_token_ids=lm.eos_token_ids)


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_the_gpu_stand_ins_compute_the_stock_modules_and_keep_greedy_output(make):
    lm = make()
    kernels.use(lm.model, kernels.STOCK)
    stand_in = fused_copy(lm)
    assert fused.fuse(stand_in.model) == 0  # a stand-in is not fused again
    assert kernels.kernels_of(stand_in.model) == kernels.PACKED and kernels.kernels_of(lm.model) == kernels.STOCK
    assert {k: v.shape for k, v in stand_in.model.state_dict().items()} == \
        {k: v.shape for k, v in lm.model.state_dict().items()}  # saved drafter weights load into either
    for ids in PROMPTS:
        torch.testing.assert_close(logits(stand_in.model, ids), logits(lm.model, ids), rtol=1e-5, atol=1e-5)
    for options in (DecodeOptions(max_new_tokens=12), DecodeOptions(max_new_tokens=12, kv_cache="fixed"),
                    DecodeOptions(method="speculative", drafter="prompt-lookup", max_new_tokens=12, kv_cache="fixed")):
        want = generate(DecodeOptions(max_new_tokens=12), PROMPTS[1], target=lm).output_ids
        assert generate(options, PROMPTS[1], target=stand_in).output_ids == want, options
    qkv = stand_in.model.model.layers[0].self_attn.qkv.weight
    assert kernels.unpack(stand_in.model) == 4 * lm.model.config.num_hidden_layers + 1
    assert kernels.kernels_of(stand_in.model) == kernels.STOCK
    fused.fuse(stand_in.model)
    assert stand_in.model.model.layers[0].self_attn.qkv.weight is qkv  # fused again: the same tensors (graphs)
    kernels.unpack(stand_in.model)
    assert torch.equal(logits(stand_in.model, PROMPTS[0]), logits(lm.model, PROMPTS[0]))  # the very modules back


def test_the_joined_weights_follow_a_load_and_a_replaced_weight():
    lm, other = tiny_llama(), tiny_llama(seed=7)
    kernels.use(lm.model, kernels.STOCK)
    kernels.use(other.model, kernels.STOCK)
    stand_in = fused_copy(lm)
    stand_in.model.load_state_dict(other.model.state_dict())  # copies into the views: the joined weight sees it
    torch.testing.assert_close(logits(stand_in.model, PROMPTS[0]), logits(other.model, PROMPTS[0]),
                               rtol=1e-5, atol=1e-5)
    for model in (stand_in.model, other.model):  # a new tensor (as .to() makes): the stand-in joins again
        attention = model.model.layers[0].self_attn
        attention.k_proj.weight = torch.nn.Parameter(attention.k_proj.weight.detach() * 2, requires_grad=False)
    torch.testing.assert_close(logits(stand_in.model, PROMPTS[0]), logits(other.model, PROMPTS[0]),
                               rtol=1e-5, atol=1e-5)


def test_gemma_and_non_float32_inputs_stay_on_the_stock_path():
    gemma = copy.deepcopy(tiny_gemma3().model)
    kernels.use(gemma, kernels.STOCK)
    assert fused.fuse(gemma) == 0  # Gemma's norm scales by (1 + w) and its attention is another code: left as is
    norm = fused.FusedRMSNorm(tiny_llama().model.model.norm)
    x = torch.randn(3, norm.weight.shape[0], dtype=torch.bfloat16)
    assert torch.equal(norm(x), norm.stock(x))  # bfloat16 keeps transformers' two roundings


def test_pack_fuses_only_on_a_gpu_and_packs_only_on_a_cpu():
    model = copy.deepcopy(tiny_llama().model)
    assert not kernels.fusing_available(model)  # float32 on the CPU: oneDNN packing is this device's fast path
    kernels.pack(model)
    assert not fused.is_fused(model)
    assert fused.fuse(model) == 2 * model.config.num_hidden_layers + 1  # packed linears are not joined: norms only
