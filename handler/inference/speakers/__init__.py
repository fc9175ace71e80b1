"""Who spoke when: the diarizer and its parts, one word at this layer as at the others
(``handler.pipeline.speakers`` runs it beside a job, ``handler.output.speakers`` joins its
turns to the transcript).

- ``diarizer``: the CAM++ embedding model (onnxruntime) and the whole recipe, ``load``;
- ``windows``: speech regions and the windows embedded in them;
- ``turns``: labelled windows as speaker turns, snapped to pauses, and their labels;
- ``clusters``: average-linkage clustering of the embeddings (NumPy);
- ``features``: Kaldi filterbanks, CAM++'s input (NumPy);
- ``online``: a live session's speakers, turn by turn (NumPy).

Each is imported by its own name (this package imports none of them, so none imports it
back). The model (``diarizer``, onnxruntime) only where a deployment turns diarization on
(``WHISPER_DIARIZATION``); the live routes import ``online`` and ``turns`` (NumPy alone)
at start.
"""
