"""Retrieval quality of memory.search on the LoCoMo conversations, beside bm25s on the same rows.

    .venv/bin/python bench/locomo.py [--data ../shared/bench/locomo] [--limit-questions N]

Starts its own redis-server on a free loopback port and writes through the Flask app
in-process: one memory row per dialogue turn (key = its ``dia_id``, value ``"<speaker>:
<text>"`` plus ``" [image: <blip_caption>]"`` where the turn has one), one user per
conversation. Every question of categories 1-4 is asked with ``memory.search`` (read_scope
own_user, limit 20) and recall@k is the share of its ``evidence`` turns among the first k hits,
averaged over the questions. bm25s (English stop words, PyStemmer's English stemmer) indexes the
same texts per conversation in the same run. No embeddings endpoint is configured: this is the
lexical leg alone.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "bench" / "locomo"))
    parser.add_argument("--limit-questions", type=int, default=0,
                        help="ask at most this many questions per conversation (0: all)")
    args = parser.parse_args(argv)
    files = sorted(Path(args.data).glob("*.json"))
    if not files:
        print(f"no conversations under {args.data}", file=sys.stderr)
        return 2
    stemmer = Stemmer.Stemmer("english")
    totals = {"loom": dict.fromkeys(KS, 0.0), "bm25s": dict.fromkeys(KS, 0.0)}
    questions = 0
    search_seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="loom-locomo-") as tmp:
        workdir = Path(tmp)
        server = RedisServerProcess(workdir / "redis", appendonly=False).start()
        try:
            app = create_app({"redis_url": server.url, "data_dir": str(workdir / "loom"),
                              "secret_key": secrets.token_hex(32)})
            client = app.test_client()

            def post(op: str, **body: Any) -> dict[str, Any]:
                response = client.post(f"/v1/{op}",
                                       json={"namespace": NAMESPACE, "agent": AGENT, **body})
                if response.status_code != 200:
                    raise RuntimeError(f"{op}: {response.status_code} {response.get_json()}")
                return response.get_json()

            for path in files:
                conversation = json.loads(path.read_text(encoding="utf-8"))
                user = f"conv-{path.stem}"
                turns = turns_of(conversation)
                for dia_id, text in turns:
                    post("memory.set", user_id=user, key=dia_id, value=text)
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
                    ours = [hit["key"] for hit in out["hits"]]
                    tokens = bm25s.tokenize([question["question"]], stopwords="en",
                                            stemmer=stemmer, show_progress=False)
                    docs, _scores = retriever.retrieve(tokens, k=min(max(KS), len(turns)),
                                                       show_progress=False)
                    theirs = [corpus_ids[int(i)] for i in docs[0]]
                    for k in KS:
                        totals["loom"][k] += recall_at(ours, evidence, k)
                        totals["bm25s"][k] += recall_at(theirs, evidence, k)
                    questions += 1
        finally:
            server.stop()
    print(f"LoCoMo retrieval: {len(files)} conversations, {questions} questions "
          f"(categories 1-4), no embeddings endpoint")
    for name in ("loom", "bm25s"):
        figures = "  ".join(f"recall@{k} {totals[name][k] / questions:.3f}" for k in KS)
        print(f"  {name:6s} {figures}")
    ratio = totals["loom"][10] / totals["bm25s"][10] if totals["bm25s"][10] else float("nan")
    print(f"  loom / bm25s at recall@10: {ratio:.3f}; "
          f"memory.search mean {1000 * search_seconds / questions:.2f} ms through the app")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
