"""The faster-whisper worker.

OpenMP's wait policy is read once, by libgomp, when CTranslate2 is first imported, and
``handler.job`` imports CTranslate2: so it is set here, when the package itself is first
imported, before any of its modules (see handler.threads; a deployment's own
``OMP_WAIT_POLICY`` wins).
"""

from handler import threads as _threads

_threads.configure()
