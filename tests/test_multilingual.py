"""The multilingual base model (two PyPI parts, hash-checked): language detection and text."""

from __future__ import annotations

import pytest

from handler.errors import Code
from handler.job import run_job
from tests.conftest import DATA, b64, make_settings, words

pytestmark = pytest.mark.model

CLIPS = {
    "de": (
        "de_espeak.flac",
        "Guten Morgen. Heute ist das Wetter in Berlin sehr schön, und wir gehen am "
        "Nachmittag in den Park.",
    ),
    "es": (
        "es_espeak.flac",
        "Buenos días. Hoy hace muy buen tiempo en Madrid, y por la tarde vamos a caminar "
        "por el parque.",
    ),
}


@pytest.fixture(scope="module")
def base_worker(base_model_dir):
    from handler.startup import start_worker

    settings = make_settings(device="cpu", model=str(base_model_dir))
    return start_worker(settings)


@pytest.mark.parametrize("lang", sorted(CLIPS))
def test_detects_language_and_transcribes(base_worker, lang):
    name, reference = CLIPS[lang]
    result = run_job({"audio_base64": b64(DATA / name), "output": ["text"]}, base_worker)
    assert "error" not in result, result
    assert result["language"] == lang
    assert result["language_probability"] > 0.3  # espeak voices are not natural speech
    ref, hyp = set(words(reference)), set(words(result["text"]))
    assert len(ref & hyp) / len(ref) >= 0.6, result["text"]


def test_translate_is_one_pass_into_english(base_worker):
    name, _ = CLIPS["es"]
    result = run_job(
        {"audio_base64": b64(DATA / name), "task": "translate", "output": ["text", "verbose_json"]},
        base_worker,
    )
    assert "error" not in result, result
    assert result["verbose_json"]["task"] == "translate"
    hyp = set(words(result["text"]))
    assert hyp & {"good", "morning", "weather", "madrid", "today", "park", "afternoon"}


def test_language_not_supported_is_invalid_input(base_worker):
    result = run_job({"audio_base64": b64(DATA / "jfk.wav"), "language": "xx"}, base_worker)
    assert result["error_code"] == Code.INVALID_INPUT


def test_a_second_allowed_model_is_chosen_per_job(base_model_dir):
    from handler.startup import start_worker

    settings = make_settings(device="cpu", allowed_models=str(base_model_dir))
    w = start_worker(settings)
    assert w.pool.names == ["tiny.en", base_model_dir.name]
    name, _ = CLIPS["de"]
    result = run_job({"audio_base64": b64(DATA / name), "model": base_model_dir.name}, w)
    assert result["language"] == "de" and result["model"] == base_model_dir.name
    default = run_job({"audio_base64": b64(DATA / "jfk.mp3")}, w)
    assert default["model"] == "tiny.en"


def test_deployment_language_and_detection_set(base_model_dir):
    from handler.startup import start_worker

    de, es = b64(DATA / CLIPS["de"][0]), b64(DATA / CLIPS["es"][0])
    forced = start_worker(make_settings(device="cpu", model=str(base_model_dir), language="es"))
    assert run_job({"audio_base64": es}, forced)["language"] == "es"
    # A job's own language still wins over the deployment's.
    assert run_job({"audio_base64": de, "language": "de"}, forced)["language"] == "de"
    among = start_worker(
        make_settings(device="cpu", model=str(base_model_dir), languages="en,es,fr")
    )
    for batch in (1, 8):
        out = run_job({"audio_base64": es, "batch_size": batch}, among)
        assert out["language"] == "es", out
        out = run_job({"audio_base64": de, "batch_size": batch}, among)
        assert out["language"] in {"en", "es", "fr"}, out  # German is not on the list
