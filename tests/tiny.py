"""Tiny random-init causal LMs built from configs (no downloads), float32, for exact checks."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, replace

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

# SPECLAB_TEST_DEVICE=cuda puts every tiny model on a GPU, so the exactness and sampling tests run there unchanged.
TEST_DEVICE = torch.device(os.environ.get("SPECLAB_TEST_DEVICE", "cpu"))


@dataclass
class TinyLM:
    """Satisfies decoders.api.LanguageModel without a tokenizer: token i is the text "<i>"."""

    model: torch.nn.Module
    name: str = "tiny"
    eos_token_ids: tuple[int, ...] = ()
    context_length: int = 256
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: TEST_DEVICE)
    source: str = "random init"

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        vocab = self.model.config.vocab_size
        return [ord(c) % vocab for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def with_eos(self, *eos: int) -> "TinyLM":
        return replace(self, eos_token_ids=tuple(eos))


def tiny_llama(vocab: int = 64, seed: int = 0, layers: int = 2, scale: float = 0.3) -> TinyLM:
    """A 2-layer Llama with weights large enough that next-token distributions are peaked, not uniform."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=scale, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval().to(TEST_DEVICE)
    return TinyLM(model, name=f"tiny-llama-{seed}")


def tiny_qwen2(vocab: int = 64, seed: int = 0, layers: int = 2, scale: float = 0.3) -> TinyLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=scale, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).float().eval().to(TEST_DEVICE)
    return TinyLM(model, name=f"tiny-qwen2-{seed}")


def noisy_copy(lm: TinyLM, noise: float = 0.05, seed: int = 1) -> TinyLM:
    """The target with small weight noise: a good but imperfect draft."""
    model = copy.deepcopy(lm.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            noise_draw = torch.randn(param.shape, generator=generator).to(param.device)  # same draw on any device
            param.add_(noise_draw * noise * param.std().clamp_min(1e-3))
    return replace(lm, model=model, name=lm.name + "-noisy")


def tiny_gemma3(vocab: int = 64, seed: int = 0, layers: int = 4, sliding_window: int = 6) -> TinyLM:
    """Gemma3 with sliding-window layers and a tiny window, so generation runs past the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                              sliding_window=sliding_window, initializer_range=0.3)
    model = Gemma3ForCausalLM(config).float().eval().to(TEST_DEVICE)
    return TinyLM(model, name=f"tiny-gemma3-{seed}")


MIXED_LAYER_TYPES = ("sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention")


def tiny_gemma3_mixed(vocab: int = 64, seed: int = 0, sliding_window: int = 8) -> TinyLM:
    """Gemma3 with 6 layers, sliding and full mixed as in gemma3-270m (first full layer: 2), window 8, so that
    prompts and outputs longer than the window exercise both mask kinds and the sliding cache's rollback."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                              layer_types=list(MIXED_LAYER_TYPES), num_attention_heads=4, num_key_value_heads=2,
                              head_dim=8, max_position_embeddings=256, sliding_window=sliding_window,
                              initializer_range=0.3, attn_implementation="sdpa")
    model = Gemma3ForCausalLM(config).float().eval().to(TEST_DEVICE)
    return TinyLM(model, name=f"tiny-gemma3-mixed-{seed}")
