"""Live audio: OpenAI's Realtime transcription protocol on ``/v1/realtime?intent=transcription``.

A client appends audio in small base64 chunks; server VAD (or the client's commits) closes
turns; each turn is transcribed through the same pipeline as a file (``run_job`` with the
decoded samples: the engine batches its windows with other sessions' turns and with file
jobs, round-robin), and answered with OpenAI's events. Served:

- client events: ``session.update`` (a transcription session: ``audio.input.format``
  ``audio/pcm`` at 24 kHz or another PCM rate, ``audio/pcmu``, ``audio/pcma``;
  ``audio.input.transcription`` ``model``, ``language``, ``prompt``;
  ``audio.input.turn_detection`` ``server_vad`` with ``threshold``, ``prefix_padding_ms``,
  ``silence_duration_ms``, or null for manual commits), the older
  ``transcription_session.update`` shape, ``input_audio_buffer.append``, ``.commit`` and
  ``.clear``;
- server events: ``session.created``/``.updated`` (``transcription_session.*`` for the old
  shape), ``input_audio_buffer.speech_started``/``speech_stopped`` (``audio_start_ms``,
  ``audio_end_ms``), ``.committed``, ``.cleared``, ``conversation.item.added``,
  ``conversation.item.input_audio_transcription.delta`` (interim text of a turn still being
  spoken, re-decoded every ``INTERIM_EVERY_S`` of new audio; only words two decodes agree
  on are sent, so deltas do not take text back; a turn's deltas add up to its completed
  transcript), ``...completed`` (the transcript and ``usage``), ``...failed``, and
  ``error`` (OpenAI's error body; the session goes on).

Refused with an ``error`` event: conversation sessions (this is transcription only),
binary messages, an event nested deeper than 16 (then closed, 1008). Bounded by the
``WHISPER_REALTIME_*`` settings: sessions at once, session length, idle time, audio
buffered per turn, message size (uvicorn closes an oversized message with 1009). A client
that vanishes cancels its turns at their next cancel check.

- ``protocol``: OpenAI's session object (``Config``) and error events: what a client sends
  and is answered, validated whole before anything is applied;
- ``buffer``: the session's audio since its last commit, on the session's clock;
- ``session``: one WebSocket's loop, its turns, interim and final decodes; ``serve``.
"""

from handler.faces.realtime.session import LiveState, serve, serve_on

__all__ = ["LiveState", "serve", "serve_on"]
