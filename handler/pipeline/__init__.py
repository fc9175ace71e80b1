"""One job from input to result, in steps of their own (the faces hand jobs in here).

- ``runtime``: what every step is handed (the worker's ``Runtime``, one job's ``Call``, its
  ``Plan``); it imports no step.
- ``job``: parse, plan, fetch + decode, transcribe, then ``answer``; ``run_job`` is the
  one entry, and it never raises.
- ``split``: a long recording cut at silences, its pieces run as jobs, stitched back.
- ``speakers``: a diarized job's reference clips and the diarizer beside the transcription.
- ``answer``: the output object: formats, legacy keys, timings, offload to S3.

The pipeline imports no face: it knows neither RunPod nor HTTP.
"""
