"""The faster-whisper worker.

Two process-wide policies are read once, by native libraries, before their first use, so
they are set here, when the package itself is first imported, before any of its modules
(whichever entry point started the process): OpenMP's wait policy, read by libgomp when
CTranslate2 is first imported (handler.threads), and glibc's allocator policy, which must
be in place before the first large allocation (handler.allocator). A deployment's own
settings of either win.
"""

from handler import allocator as _allocator
from handler import threads as _threads

_allocator.configure()
_threads.configure()
