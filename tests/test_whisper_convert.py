"""The CTranslate2 -> openai-whisper converter, checked against CTranslate2 / faster-whisper on real speech."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("whisper")
ctranslate2 = pytest.importorskip("ctranslate2")

from whisper_helpers import SHORT_CLIPS, TINY, clip, tiny_model  # noqa: E402

from decoders.whisper.convert import model_dims, to_whisper_checkpoint  # noqa: E402
from decoders.whisper.ct2 import read_ct2  # noqa: E402
from decoders.whisper.models import WHISPER_REGISTRY, ensure_checkpoint  # noqa: E402
from decoders.whisper.task import mel_for  # noqa: E402

pytestmark = pytest.mark.slow
SOT = (50257, 50362)  # tiny.en: <|startoftranscript|> <|notimestamps|>


@pytest.fixture(scope="module")
def ct2_tiny():
    folder = WHISPER_REGISTRY[TINY].parts[0].locate().parent
    return ctranslate2.models.Whisper(str(folder), device="cpu", compute_type="float32", intra_threads=1)


def test_checkpoint_loads_strictly_with_the_dims_of_tiny_en():
    import whisper

    checkpoint = torch.load(ensure_checkpoint(TINY), weights_only=True)
    model = whisper.model.Whisper(whisper.model.ModelDimensions(**checkpoint["dims"]))
    missing, unexpected = model.load_state_dict(checkpoint["model_state_dict"], strict=True)
    assert (missing, unexpected) == ([], [])
    assert checkpoint["dims"] == {"n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 384, "n_audio_head": 6,
                                  "n_audio_layer": 4, "n_vocab": 51864, "n_text_ctx": 448, "n_text_state": 384,
                                  "n_text_head": 6, "n_text_layer": 4}


def test_dropped_key_biases_are_zero_in_the_source():
    """The converter drops CTranslate2's key bias (Whisper's key Linear has none): only safe if it is zero."""
    _, variables = read_ct2([WHISPER_REGISTRY[TINY].parts[0].locate()])
    d = model_dims(variables)["n_text_state"]
    for side, n in (("encoder", 4), ("decoder", 4)):
        for i in range(n):
            assert not np.any(variables[f"{side}/layer_{i}/self_attention/linear_0/bias"][d:2 * d])
    for i in range(4):
        assert not np.any(variables[f"decoder/layer_{i}/attention/linear_1/bias"][:d])


def test_converter_rejects_a_non_whisper_spec():
    from decoders.whisper.convert import ConversionError

    with pytest.raises(ConversionError, match="WhisperSpec"):
        to_whisper_checkpoint("TransformerSpec", {})


@pytest.fixture(scope="module")
def tiny_variables() -> dict:
    _, variables = read_ct2([WHISPER_REGISTRY[TINY].parts[0].locate()])
    return variables


def test_converter_refuses_what_whisper_cannot_express(tiny_variables):
    """Each check must fire on a file that differs from openai-whisper's layout in one way (review #15)."""
    from decoders.whisper.convert import ConversionError

    d = model_dims(tiny_variables)["n_text_state"]
    key_bias = tiny_variables["decoder/layer_1/self_attention/linear_0/bias"].copy()
    key_bias[d + 5] = 0.25
    cross_bias = tiny_variables["decoder/layer_0/attention/linear_1/bias"].copy()
    cross_bias[0] = -0.5
    cases = {"decoder/scale_embeddings": ({"decoder/scale_embeddings": np.int8(1)}, "scale_embeddings is 1"),
             "alibi": ({"decoder/alibi": np.int8(1)}, "alibi is 1"),
             "activation": ({"decoder/activation": np.int8(1)}, "activation is 1"),
             "untied projection": ({"decoder/projection/weight": tiny_variables["decoder/projection/weight"] * 2},
                                   "differs from the token embedding"),
             "self key bias": ({"decoder/layer_1/self_attention/linear_0/bias": key_bias}, "key bias is not zero"),
             "cross key bias": ({"decoder/layer_0/attention/linear_1/bias": cross_bias}, "key bias is not zero")}
    for case, (changes, message) in cases.items():
        with pytest.raises(ConversionError, match=message):
            to_whisper_checkpoint("WhisperSpec", {**tiny_variables, **changes})


def test_int8_weights_are_dequantised_with_their_scales_and_refused_without(tiny_variables):
    from decoders.whisper.convert import ConversionError

    name = "decoder/layer_0/ffn/linear_0/weight"
    weight = tiny_variables[name].astype(np.float32)                       # (4d, d)
    scale = (127 / np.abs(weight).max(axis=1)).astype(np.float32)          # (4d,): CTranslate2's per-row scale
    quantised = np.round(weight * scale[:, None]).astype(np.int8)
    converted = to_whisper_checkpoint("WhisperSpec", {**tiny_variables, name: quantised, name + "_scale": scale})
    restored = converted["model_state_dict"]["decoder.blocks.0.mlp.0.weight"].numpy()
    assert np.abs(restored - weight).max() <= 0.5 / scale.min() + 1e-6  # within half a quantisation step
    with pytest.raises(ConversionError, match="without .*_scale"):
        to_whisper_checkpoint("WhisperSpec", {**tiny_variables, name: quantised})


@pytest.mark.parametrize("name", SHORT_CLIPS)
def test_per_step_logits_match_ctranslate2(ct2_tiny, name):
    """Teacher-forced on CTranslate2's own greedy output: every step's logits within float32 rounding."""
    model = tiny_model()
    mel = mel_for(model, clip(name))                                                   # (80, 3000)
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None].numpy()))
    result = ct2_tiny.generate(features, [list(SOT)], beam_size=1, return_logits_vocab=True)[0]
    ids = result.sequences_ids[0]
    with torch.no_grad():
        ours = model(mel[None], torch.tensor([list(SOT) + ids]))[0, len(SOT) - 1:]      # (len(ids) + 1, V)
    theirs = np.stack([np.asarray(step) for step in result.logits[0]])                # (steps, V)
    assert len(theirs) >= len(ids)
    allowed = theirs > -1e30  # CTranslate2 writes -FLT_MAX into the tokens its filters suppress
    diff = np.abs(theirs - ours[:len(theirs)].numpy())[allowed]
    assert diff.max() < 2e-4, f"max |logit difference| {diff.max():.2e}"


@pytest.mark.parametrize("beam_size", [1, 5])
def test_tokens_match_ctranslate2_greedy_and_beam(ct2_tiny, beam_size):
    import whisper

    model = tiny_model()
    for name in SHORT_CLIPS:
        mel = mel_for(model, clip(name))
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None].numpy()))
        theirs = ct2_tiny.generate(features, [list(SOT)], beam_size=beam_size)[0].sequences_ids[0]
        ours = whisper.decode(model, mel, whisper.DecodingOptions(
            language="en", beam_size=None if beam_size == 1 else beam_size, without_timestamps=True, fp16=False))
        assert ours.tokens == [t for t in theirs if t != 50256], name


def test_transcripts_match_faster_whisper(ct2_tiny):
    """faster-whisper's whole pipeline against our model on the features that pipeline computes.

    faster-whisper pads its mel with zeros where openai-whisper pads the audio with silence, and that alone can
    change a word (on librivox-0880 beam 5: "ill-disposed" vs "old-sposed"), so the model is compared on the
    same features: its numpy STFT of the samples, cut and zero-padded as its generate_segments does.
    """
    import whisper
    from faster_whisper.audio import pad_or_trim

    faster_whisper = pytest.importorskip("faster_whisper")
    folder = WHISPER_REGISTRY[TINY].parts[0].locate().parent
    fw = faster_whisper.WhisperModel(str(folder), device="cpu", compute_type="float32", cpu_threads=1)
    model = tiny_model()
    for name in SHORT_CLIPS:
        audio = clip(name)
        features = fw.feature_extractor(audio.samples, chunk_length=30)                  # (80, frames + 1)
        segment = torch.from_numpy(pad_or_trim(features[:, :features.shape[-1] - 1]))     # (80, 3000)
        for beam_size in (1, 5):
            segments, _ = fw.transcribe(audio.samples, language="en", beam_size=beam_size, temperature=0.0,
                                        without_timestamps=True, condition_on_previous_text=False, vad_filter=False)
            theirs = "".join(s.text for s in segments).strip()
            ours = whisper.decode(model, segment.float(), whisper.DecodingOptions(
                language="en", beam_size=None if beam_size == 1 else beam_size, without_timestamps=True, fp16=False))
            assert ours.text == theirs, (name, beam_size)
