"""Text as the benches score it: Whisper's normalisers (English, and the basic one with the
diacritics removed for the other languages), with digits written as words."""

from __future__ import annotations

import re

from whisper_normalizer.basic import BasicTextNormalizer
from whisper_normalizer.english import EnglishTextNormalizer

_EN = EnglishTextNormalizer()
BASIC = BasicTextNormalizer(remove_diacritics=True)


_DIGITS = re.compile(r"\d+")


def _number_words(text: str, language: str) -> str:
    """Digits as words in the language (num2words), so "нажмите 1" and "нажмите один" score
    the same. The English normaliser already equates the two (it turns words into digits);
    the basic one leaves "1" and "один" apart, and Whisper writes either, from run to run."""
    from num2words import num2words

    def words(m: re.Match[str]) -> str:
        if len(m.group()) > 15:  # a digit string, not a number anyone would say
            return m.group()
        try:
            return f" {num2words(int(m.group()), lang=language)} "
        except (NotImplementedError, OverflowError):
            return m.group()

    return _DIGITS.sub(words, text)


def normalise(text: str, language: str) -> str:
    if language == "en":
        out = _EN(text)
    else:
        out = BASIC(_number_words(BASIC(text), language))
    # The English normaliser keeps a lone "." (decimals): "..." is no word, on silence
    # least of all.
    return " ".join(t for t in out.split() if any(c.isalnum() for c in t))
