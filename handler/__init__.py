"""The faster-whisper worker, grouped by role (docs/architecture.md has the map).

- ``faces/``: how jobs arrive (the RunPod handlers, the HTTP routes, the OpenAI mapping);
- ``audio/``: untrusted bytes in (sources, the SSRF-guarded fetch, bounded decoding);
- ``inference/``: the model (the only folder that imports faster-whisper or CTranslate2);
- ``output/``: results out (formats, subtitle cues, offload of large results);
- underneath: ``settings``, ``schema``, ``errors``, ``guard``, ``contract``;
- on top: ``__main__`` and ``cli`` (entry points), ``startup``, ``job`` (the pipeline).

Importing this package changes nothing in the caller's process: the process-wide policies
that the native libraries read are applied by ``handler.inference`` (see its docstring),
which a client importing ``handler.contract`` never loads.
"""
