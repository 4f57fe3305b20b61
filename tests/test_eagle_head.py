"""EAGLE head: shapes, the frozen shared LM head, the official SafeAILab/EAGLE format, the offline message."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from decoders.eagle.head import EagleHead, causal_mask
from decoders.eagle.official import EagleHeadError, load_official, resolve_folder, save_official
from decoders.tree import attention_mask_4d, position_ids
from tiny import tiny_gemma3, tiny_llama, tiny_qwen2

D, V = 32, 64  # tiny models: hidden size, vocabulary

# The key names SafeAILab/EAGLE's cnets1.Model saves for a Llama-family EAGLE-1/2 head (no input_layernorm in
# layer 0), written out by hand from its source rather than from our module.
OFFICIAL_LLAMA_KEYS = {
    "fc.weight": (D, 2 * D), "fc.bias": (D,),
    "layers.0.self_attn.q_proj.weight": (D, D), "layers.0.self_attn.k_proj.weight": (16, D),
    "layers.0.self_attn.v_proj.weight": (16, D), "layers.0.self_attn.o_proj.weight": (D, D),
    "layers.0.mlp.gate_proj.weight": (64, D), "layers.0.mlp.up_proj.weight": (64, D),
    "layers.0.mlp.down_proj.weight": (D, 64), "layers.0.post_attention_layernorm.weight": (D,),
}


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2, tiny_gemma3])
def test_forward_shapes_and_cache_equal_full_forward(make):
    head = EagleHead(make().model)
    ids, feats = torch.randint(0, V, (2, 7)), torch.randn(2, 7, D)
    hidden, logits = head(ids, feats)
    assert hidden.shape == (2, 7, D) and logits.shape == (2, 7, V)
    cache = DynamicCache(config=head.config)
    first, _ = head(ids[:1, :4], feats[:1, :4], cache=cache)
    second, _ = head(ids[:1, 4:], feats[:1, 4:], cache=cache)
    torch.testing.assert_close(torch.cat([first, second], 1), hidden[:1], atol=1e-5, rtol=1e-5)


def test_tree_mask_forward_matches_each_branch_run_alone():
    head = EagleHead(tiny_llama().model).eval()
    ids, feats = torch.randint(0, V, (1, 5)), torch.randn(1, 5, D)
    parents = [-1, 0, 0]  # two siblings under one node
    with torch.no_grad():
        cache = DynamicCache(config=head.config)
        head(ids[:, :2], feats[:, :2], cache=cache)  # a committed prefix of 2
        tree_out, _ = head(ids[:, 2:], feats[:, 2:], position_ids(parents, 2)[None], cache,
                           attention_mask_4d(parents, 2, torch.float32))
        for sibling in (1, 2):
            alone = DynamicCache(config=head.config)
            head(ids[:, :2], feats[:, :2], cache=alone)
            keep = [0, sibling]
            chain, _ = head(ids[:, 2:][:, keep], feats[:, 2:][:, keep], cache=alone)
            torch.testing.assert_close(tree_out[0, sibling], chain[0, 1], atol=1e-5, rtol=1e-5)


def test_lm_head_and_embedding_are_shared_frozen_and_not_saved():
    target = tiny_llama().model
    head = EagleHead(target)
    before = target.lm_head.weight.detach().clone()
    own = {id(p) for p in head.parameters()}
    assert id(target.lm_head.weight) not in own and id(target.model.embed_tokens.weight) not in own
    assert not any(k.startswith(("lm_head", "embed_tokens")) for k in head.state_dict())
    assert head.lm_head is target.lm_head and head.embedding is target.model.embed_tokens  # shared, not copied
    optimizer = torch.optim.SGD(head.parameters(), lr=1.0)
    _, logits = head(torch.randint(0, V, (1, 6)), torch.randn(1, 6, D))
    logits.logsumexp(-1).sum().backward()
    optimizer.step()
    assert target.lm_head.weight.grad is None and target.model.embed_tokens.weight.grad is None
    assert torch.equal(target.lm_head.weight, before)
    assert head.fc.weight.grad is not None


def test_reduced_vocab_scores_only_its_ids_and_maps_back():
    target = tiny_llama().model
    full = EagleHead(target)
    ids = torch.tensor([5, 9, 2, 40])
    reduced = EagleHead(target, vocab_ids=ids)
    reduced.load_state_dict(full.state_dict())
    tokens, feats = torch.randint(0, V, (1, 3)), torch.randn(1, 3, D)
    _, full_logits = full(tokens, feats)
    _, small_logits = reduced(tokens, feats)
    assert small_logits.shape == (1, 3, 4)
    torch.testing.assert_close(small_logits, full_logits[..., ids])
    assert reduced.to_target_ids(torch.tensor([0, 3])).tolist() == [5, 40]
    with pytest.raises(ValueError, match="distinct target ids"):
        reduced.set_draft_vocab(torch.tensor([1, 1]))


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_official_round_trip(tmp_path, make):
    target = make().model
    head = EagleHead(target, vocab_ids=torch.tensor([3, 1, 4]))
    save_official(head, tmp_path, extra={"target": "tiny"})
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is True
    assert config.get("qkv_bias", False) == (make is tiny_qwen2)
    loaded = load_official(tmp_path, target)
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert loaded.vocab_ids.tolist() == [3, 1, 4]


def test_hand_built_official_state_dict_loads_strictly(tmp_path):
    target = tiny_llama().model
    generator = torch.Generator().manual_seed(3)
    state = {k: torch.randn(shape, generator=generator) for k, shape in OFFICIAL_LLAMA_KEYS.items()}
    state["embed_tokens.weight"] = torch.randn(V, D)  # some releases ship it; the target's is used
    state["layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # old releases saved this buffer
    torch.save(state, tmp_path / "pytorch_model.bin")
    config = target.config.to_dict() | {"num_hidden_layers": 1, "bias": True, "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config, default=str))
    head = load_official(tmp_path, target)
    assert torch.equal(head.fc.weight, state["fc.weight"])
    assert torch.equal(head.layers[0].mlp.down_proj.weight, state["layers.0.mlp.down_proj.weight"])
    assert head.embedding is target.model.embed_tokens  # the shipped embedding was not loaded into the head

    del state["layers.0.mlp.up_proj.weight"]
    state["layers.0.input_layernorm.weight"] = torch.ones(D)  # not in EAGLE's layer 0
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(EagleHeadError, match="missing .*up_proj.*unexpected .*input_layernorm"):
        load_official(tmp_path, target)


def test_head_for_another_target_is_refused(tmp_path):
    save_official(EagleHead(tiny_llama(vocab=80).model), tmp_path)
    with pytest.raises(EagleHeadError, match="vocab_size 80.*this target has 64"):
        load_official(tmp_path, tiny_llama().model)


def test_offline_hub_id_gives_one_clear_message(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(EagleHeadError) as caught:
        resolve_folder("yuhuili/EAGLE-Vicuna-7B-v1.3")
    message = str(caught.value)
    assert "could not download the EAGLE head 'yuhuili/EAGLE-Vicuna-7B-v1.3'" in message
    assert "offline" in message and "python -m decoders.eagle train" in message and "\n" not in message


def test_missing_local_folder_names_the_expected_layout(tmp_path):
    with pytest.raises(EagleHeadError, match="no EAGLE head folder .*config.json"):
        resolve_folder(tmp_path / "nowhere" / "head")


def test_causal_mask_sees_cache_and_earlier_positions():
    mask = causal_mask(2, 3, torch.float32)[0, 0]  # (2, 5)
    assert (mask[0, :4] == 0).all() and mask[0, 4] < -1e30 and (mask[1] == 0).all()


def test_a_target_without_a_head_gets_the_train_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    from decoders.eagle.official import locate_head

    with pytest.raises(EagleHeadError, match=r"no EAGLE head for 'qwen2.5-coder-1.5b' yet; .*"
                                             r"python -m decoders.eagle train --target qwen2.5-coder-1.5b$"):
        locate_head("qwen2.5-coder-1.5b")
    folder = tmp_path / "eagle" / "qwen2.5-coder-1.5b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert locate_head("qwen2.5-coder-1.5b") == folder
