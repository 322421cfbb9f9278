"""Recall by meaning: embeddings of every indexed document, for ``recallEmbeddings``.

The embedding model is WordLlama (``pip install 'om[embeddings]'``): static token embeddings whose
default weights (``l2_supercat``, 256 dimensions, 16 MB) and tokenizer ship inside its wheel, so
nothing is downloaded at run time. Its 0.4 loader looks for the packaged tokenizer under
``wordllama/tokenizer/`` while the wheel holds ``wordllama/tokenizers/``, and would then download it;
its cache folder is pointed at the package itself, where ``tokenizers/`` holds that file, and
downloads are disabled, so a wheel without the file is a clear "unavailable", never a download.

Vectors live in ``om_internal.search_vectors`` (unit length), written beside the search terms by the
writers and caught up by a recall that finds some missing; the cosine similarity is SQL
(``sql/views/095_recall_query.sql``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol

import duckdb
import pyarrow as pa

from om_core.store.db import named_rows, scalar
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

MODEL = "wordllama/l2_supercat/256"
MAX_TEXT_CHARS = 2_000  # a tool result's tail says little more about its meaning than its head
BATCH = 2_000  # documents embedded and inserted at once


class Embedder(Protocol):
    name: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


class WordLlamaEmbedder:
    name = MODEL

    def __init__(self) -> None:
        from pathlib import Path

        import wordllama
        from wordllama import WordLlama

        package = Path(wordllama.__file__).parent  # holds tokenizers/ and weights/: the wheel's own files
        self._model = WordLlama.load(config="l2_supercat", dim=256, cache_dir=package, disable_download=True)

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        # by length: a batch is padded to its longest text, so like lengths together pad least
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors = self._model.embed([texts[i][:MAX_TEXT_CHARS] or " " for i in order], norm=True, return_np=True)
        out: list[list[float]] = [[] for _ in texts]
        for row, i in zip(vectors.tolist(), order):
            out[i] = row
        return out


@functools.lru_cache(maxsize=1)
def _loaded() -> tuple[Embedder | None, str | None]:
    try:
        return WordLlamaEmbedder(), None
    except ImportError:
        return None, "the embeddings extra is not installed (pip install 'om[embeddings]')"
    except Exception as exc:  # a wheel without its weights: keyword recall goes on, the reason is shown
        return None, f"the embedding model cannot be loaded: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def embedder() -> Embedder | None:
    """The embedding model, loaded once per process; None when the extra is absent or broken."""
    return _loaded()[0]


def unavailable() -> str | None:
    """Why recall by meaning cannot run here (None: it can)."""
    return _loaded()[1]


def _texts(rows: list[dict]) -> list[str]:
    from om_core.pi.session import loads_line
    from om_core.pi.source_text import entry_text

    texts = []
    for row in rows:
        if row["doc_kind"] != "entry":
            texts.append(row["content"] or "")
            continue
        try:
            text = entry_text(row["entry_type"], loads_line(row["raw"])) if row["raw"] is not None else ""
        except Exception:  # an entry that renders no text gets the vector of nothing, never fatal
            text = ""
        texts.append(text.encode("utf-8", "replace").decode("utf-8"))
    return texts


def refresh_vectors(con: duckdb.DuckDBPyConnection, model: Embedder) -> int:
    """Embed every indexed document that has no vector of ``model`` yet, and drop the vectors of
    documents the index no longer holds. Call inside the writer's transaction, after the search
    terms are up to date. Returns the documents embedded."""
    con.execute(query("vectors_drop_gone"))
    done = 0
    while True:
        rows = named_rows(con, "vectors_missing", {"model": model.name, "limit": BATCH})
        if not rows:
            return done
        vectors = model.embed(_texts(rows))
        batch = pa.table({"doc_kind": [r["doc_kind"] for r in rows], "scope_id": [r["scope_id"] for r in rows],
                          "doc_id": [r["doc_id"] for r in rows], "model": [model.name] * len(rows),
                          "vec": pa.array(vectors, pa.list_(pa.float32()))})
        con.register("search_vector_batch", batch)
        try:
            con.execute(query("vectors_insert"))
        finally:
            con.unregister("search_vector_batch")
        done += len(rows)


def missing(con: duckdb.DuckDBPyConnection, model: Embedder) -> int:
    return int(scalar(con, "vectors_count_missing", {"model": model.name}) or 0)


def catch_up_vectors(ws: Workspace, model: Embedder) -> int:
    """Embed what the index lacks when no other process writes (the writer lock is tried, not waited
    for). Returns the documents left without a vector."""
    from om_core.errors import DatabaseBusy
    from om_core.store.db import transaction

    with ws.read() as con:
        behind = missing(con, model)
    if not behind:
        return 0
    try:
        with ws.one_writer("recall (embedding)", busy_seconds=0.05):  # tried, not waited for
            with ws.write() as con, transaction(con):
                refresh_vectors(con, model)
                return missing(con, model)
    except (DatabaseBusy, duckdb.Error):  # another writer, or a file this user may only read
        return behind
