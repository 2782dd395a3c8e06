"""The model client: every call Loom makes to a model, over HTTP to an OpenAI-compatible server,
from a worker (jobs/) or inside a request (``memory.ask``, ``memory.search``).

- ``chat``: ``POST {base_url}/chat/completions`` for a JSON answer, the ``LOOM_LLM_*`` settings
  and the output caps;
- ``embeddings``: ``POST {base_url}/embeddings`` in batches, the ``LOOM_EMBED_*`` settings;
- ``budget``: the one way either is called, reserved against the namespace's and the org's
  budgets, settled with the reported usage and counted in the ledger;
- ``http`` and ``errors``: the POST both clients share and their one failure, ``ModelCallFailed``.

It sits in app/, below the jobs that call it: the jobs import it, it imports no job.
"""
