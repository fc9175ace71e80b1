"""The model: options, language, the engine and sequential runners, models, features.

The only folder that imports faster-whisper or CTranslate2 (besides start-up's early
import, which imports this package first). Two process-wide policies are read once by
native libraries, before their first use, so they are applied here, when this package is
first imported, before any of its modules and so before CTranslate2: OpenMP's wait policy,
read by libgomp when CTranslate2 is first imported (``threads``), and glibc's allocator
policy, which must be in place before the first large buffer (``allocator``). A
deployment's own settings of either win.
"""

from handler.inference import allocator as _allocator
from handler.inference import threads as _threads

_allocator.configure()
_threads.configure()
