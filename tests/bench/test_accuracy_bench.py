"""The accuracy bench (bench/accuracy/accuracy.py, bench/common/eval_corpus.py): its scorer,
its corpus rules, and one small run of the real worker beside plain faster-whisper on real speech.

The corpus itself (Debian packages, ~100 MB) is not fetched here; the rules that build it
are checked on lines copied from its transcripts."""

from __future__ import annotations

import numpy as np
import pytest

from bench.accuracy.accuracy import Run, run_plain, run_worker, table, wer_of
from bench.common.eval_corpus import Item, sound_effects, unsure
from bench.common.text import BASIC, normalise
from speech_assets.clips import JFK_TEXT, wav_bytes
from tests.helpers import DATA


@pytest.mark.parametrize(
    "language, digits, spoken",
    [
        # conf-adminmenu-18.wav: plain faster-whisper wrote digits, the worker words
        (
            "ru",
            "Нажмите 1, чтобы выключить микрофон, 2 чтобы...",
            "нажмите один чтобы выключить микрофон два чтобы",
        ),
        (
            "it",
            "Premere 1 per preporre un messaggio o 2 per inoltrarlo",
            "premere uno per preporre un messaggio o due per inoltrarlo",
        ),
        ("es", "Marque 23 ahora", "marque veintitrés ahora"),
        ("fr", "Appuyez sur 4 ou 6", "appuyez sur quatre ou six"),
        ("en", "Press 1 or 21", "press one or twenty one"),
    ],
)
def test_a_number_scores_the_same_as_digits_or_as_words(language, digits, spoken) -> None:
    assert normalise(digits, language) == normalise(spoken, language)
    if language != "en":  # Whisper's basic normaliser alone kept them apart (1 vs один)
        assert BASIC(digits).split() != BASIC(spoken).split()


def test_punctuation_alone_is_no_text() -> None:
    # plain faster-whisper wrote "..." on a recording of monkeys: that is not text on silence
    assert normalise("...", "en") == "" and normalise(". . .", "fr") == ""
    assert normalise("It costs $3.50.", "en") == "it costs $3.50"


def test_digit_strings_and_languages_num2words_lacks_stay_digits() -> None:
    assert normalise("call 5551234567890123456", "fr") == "call 5551234567890123456"
    assert normalise("拨 3", "zh") == "拨 3"
    assert normalise("аш 323", "ru") == "аш триста двадцать три"


def test_prompts_that_are_sounds_become_no_speech_items() -> None:
    english = {  # lines of core-sounds-en.txt
        "beep": "[this is a simple beep tone]",
        "confbridge-join": "<beep ascending>",
        "tt-monkeys": "[sound of monkeys screaming]",
        "vm-intro": "Please leave your message after the tone.  When done hang up or press "
        "the pound key. (simple tone sound plays)",
        "is": "Is.",
    }
    # the Italian transcript describes the same beep in words: it must not score as speech
    assert sound_effects(english) == {"beep", "confbridge-join", "tt-monkeys"}
    assert unsure("(ahooga)") and unsure("Il [suo] messaggio è stato salvato.")
    assert not unsure("Pour (emphase)") and not unsure("Is.")


def test_a_small_run_scores_the_worker_beside_plain(worker, tmp_path) -> None:
    """Real speech and real silence through plain faster-whisper (tiny.en) and through the
    worker's own job pipeline on the same model: the table reads as the README's does."""
    from faster_whisper import WhisperModel

    from speech_assets.models import tiny_en_dir

    silence = tmp_path / "silence.wav"
    silence.write_bytes(wav_bytes(np.zeros(3 * 16000, np.float32)))
    items = [
        Item(DATA / "jfk.wav", JFK_TEXT, "en", "read", "jfk"),
        Item(silence, "", "", "no_speech", "generated"),
    ]
    plain = run_plain(
        WhisperModel(str(tiny_en_dir()), device="cpu", compute_type="int8"), items, lambda _: None
    )
    mine = run_worker("worker", worker, {}, items, lambda _: None)
    for run in (plain, mine):
        assert isinstance(run, Run) and len(run.outcomes) == 2
        assert all(o.error is None for o in run.outcomes)
        assert wer_of(run.outcomes[:1]) is not None and wer_of(run.outcomes[:1]) < 0.1
    assert mine.outcomes[1].hyp == ""  # plain (no VAD) may say "you" here: tiny.en did
    out = table([plain, mine], audio_s=14.0)
    assert "| group | files | plain | worker |" in out
    assert "| en (all) | 1 |" in out
    said = int(bool(plain.outcomes[1].hyp))
    assert f"| text on no-speech files | | {said} | 0 |" in out
    assert f"| hallucinated files | | {said} | 0 |" in out
    assert "| language right | | 1/1 | 1/1 |" in out


def test_languages_without_spaces_are_scored_per_character(tmp_path) -> None:
    from bench.accuracy.accuracy import Outcome

    ja = Item(tmp_path / "ja.wav", "今日は晴れ", "ja", "prompt", "test")
    en = Item(tmp_path / "en.wav", "it is sunny today", "en", "prompt", "test")
    assert wer_of([Outcome(ja, "今日は雨", "ja", 1.0)]) == pytest.approx(2 / 5)  # 1 sub, 1 del
    assert wer_of([Outcome(en, "it is rainy today", "en", 1.0)]) == pytest.approx(1 / 4)
    out = table([Run("plain", [Outcome(ja, "今日は晴れ", "ja", 1.0)])], audio_s=2.0)
    assert "| ja (all, CER) | 1 | 0.0 % |" in out


def test_a_built_call_keeps_each_side_on_its_channel_and_scores_the_order_said() -> None:
    import random
    from types import SimpleNamespace

    from bench.accuracy.multichannel import build_call, score

    rng = random.Random(0)
    tone = np.sin(np.arange(16000) * 0.05).astype(np.float32) * 0.3
    a = [SimpleNamespace(samples=tone, text="one two three")]
    b = [SimpleNamespace(samples=tone * 0.5, text="four five")]
    call = build_call("c", [(a, "en"), (b, "fr")], 10.0, 1.0, rng)
    assert call.kind == "en+xx" and call.stereo.shape[1] == 2
    for start, side, _, _ in call.phrases:
        at = round(start * 16000) + 8000
        assert abs(call.stereo[at, side]) > 0 or abs(call.stereo[at - 1, side]) > 0
    # overlap 1.0: a turn starts before the other side's last phrase (1 s long) ends
    from itertools import pairwise

    assert any(b[0] < a[0] + 1.0 and b[1] != a[1] for a, b in pairwise(sorted(call.phrases)))
    segments = [
        {"start": s, "channel": side, "text": text} for s, side, _, text in sorted(call.phrases)
    ]
    perfect = {
        "segments": segments,
        "channels": [{"channel": 0, "language": "en"}, {"channel": 1, "language": "fr"}],
        "timings": {"transcribe": 2.0},
        "language": "en",
    }
    for c in perfect["channels"]:
        c["text"] = " ".join(
            t for t in (s["text"] for s in segments if s["channel"] == c["channel"])
        )
    mixed = {"segments": segments[::-1], "timings": {"transcribe": 1.0}, "language": "en"}
    row = score(call, mixed, perfect)
    assert row["wer_multichannel"] == 0.0 and row["wer_side0"] == row["wer_side1"] == 0.0
    assert row["wer_mixed"] > 0  # the turns out of order
