"""What a rank started by ``training.launch`` needs before its first step, loaded once in the
launcher's fork server rather than in every rank: torch, torch._dynamo and megatron-core (5–10 s of imports), and
the import-graph caches of ``common.codeversion`` that ``training.train.run_id`` reads (2–4 s:
the parse of each module of the closure and the installed distributions' metadata).

Only what does not depend on the environment a caller sets later: no module of ours that reads
settings at import. The parse cache is keyed by each file's bytes, so an edited file is parsed again.

The collector runs less often from here on, here and in the ranks (``common.collector``), and what this loaded
is frozen at the end (``gc.freeze()``, the ``gc`` documentation's practice for a process that forks without
exec): a rank's collections never traverse those 340,000 objects, nor copy the pages they sit on. The server
unfreezes them as it exits, so that its interpreter's last collection finalizes them as before (a frozen object
stays alive through it: triton's bindings then report their objects as leaked, on the launcher's standard error).
A rank, forked, ends with ``os._exit`` and runs no such handler.
"""

import atexit
import gc

from common.collector import collect_less_often

collect_less_often()

from training import cpu_compat  # noqa: E402  # the package's import filters megatron's known warnings (training.known_warnings)

with cpu_compat.fusions_uncompiled():
    import megatron.core  # noqa: F401
import megatron.core.dist_checkpointing  # noqa: F401, E402
import megatron.core.distributed  # noqa: F401, E402
import megatron.core.models.gpt  # noqa: F401, E402
import megatron.core.optimizer  # noqa: F401, E402
import megatron.core.pipeline_parallel  # noqa: F401, E402
import numpy  # noqa: F401, E402
import torch  # noqa: F401, E402
import torch._dynamo  # noqa: F401, E402  (torch.optim's constructors import it: 2 s in every rank otherwise)

from common.codeversion import code_version  # noqa: E402

code_version("training.train")
gc.freeze()
atexit.register(gc.unfreeze)
