"""A live session's speakers, when it asked for them (Deepgram's ``diarize``, AssemblyAI's
``speaker_labels``, the Realtime extension ``transcription.diarize``): each committed
turn's voice, found off the event loop by handler.inference.speakers.online."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from handler.inference.speakers.online import LiveSpeakers

log = logging.getLogger(__name__)


class SessionVoices:
    """The voices one session has heard; ``of`` a turn at a time, in the order turns are
    answered (the session calls it after the turn before is answered)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.speakers: LiveSpeakers | None = None

    async def of(self, samples: np.ndarray, config: Any, diarizer: Any) -> tuple[int, float] | None:
        """(the turn's speaker, its likeness) when ``config`` asks for speakers and the
        worker has a diarizer; None otherwise, or when it cannot be found (the transcript
        still goes out, without its speaker)."""
        if not config.diarize or diarizer is None:
            return None
        if self.speakers is None:
            self.speakers = LiveSpeakers(diarizer, config.max_speakers)
        try:
            return await asyncio.to_thread(self.speakers.assign, samples)
        except Exception as exc:
            log.warning(
                "session %s: a turn's speaker was not found (%s)",
                self.session_id,
                type(exc).__name__,
            )
            return None
