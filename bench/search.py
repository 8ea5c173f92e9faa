"""Paper text search at a million pages: ``app.search.query.search`` (ranked
candidates, per-paper grouping, snippets) against a bare GIN-index scan of
the same tsquery in the same run.

Builds a scratch database (migrated with ``flask db upgrade``, dropped at
the end) and loads ``--pages`` pages of ~250 words, 20 pages per paper over 5
projects, through ``COPY`` into ``paper_pages`` (its ``tsv`` is the generated
column, computed by PostgreSQL as in production). The two indexes are
dropped for the load and built after it, as a bulk restore would, then
``VACUUM ANALYZE``.

Text: a 100,000-word vocabulary (English function words first, syllable
pseudo-words after, one in ten with Polish diacritics) drawn with a Zipf
distribution (s = 1.07). Pages are 10 random 25-word passages from a pool of
200,000, so generating a million pages takes seconds, not minutes; word
frequencies stay Zipf-like, and a passage recurs on ~50 pages as boilerplate
does. Five two-word phrases of mid-frequency words are planted in 0.05% of
the passages.

Searches (each a different word or phrase, so caches warm the index, not
one answer): ``rare`` (a word in 1–3 passages: ~50–150 pages), ``common``
(the top 20 words: on nearly every page, capped at the ranked candidates),
``phrase`` (a planted phrase), ``unlikely`` (two mid-frequency words as a
phrase that chance almost never puts side by side: every page holding both
is rechecked), ``project`` (a word on about a tenth of the pages, in one of
the five projects). The baseline is ``SELECT count(*) FROM (SELECT 1 … WHERE tsv
@@ q LIMIT 1001)``: the same capped GIN scan without ranking, grouping or
snippets.

A slow machine scales down instead of dying: loading stops when
``--load-budget-s`` is spent (the line reports the pages actually loaded),
and every search runs under a statement timeout.

Last line: ``search pages=N p50_ms=… p95_ms=… baseline_p95_ms=… ratio=…``
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import random
import statistics
import time

import psycopg

from _common import BENCH_PG, fresh_database

VOCABULARY = 100_000
ZIPF_S = 1.07
PASSAGES = 200_000
PASSAGE_WORDS = 25
PASSAGES_PER_PAGE = 10
PAGES_PER_PAPER = 20
PROJECTS = [f"bench-{n}" for n in range(1, 6)]
BATCH_PAGES = 20_000
PLANTED_SHARE = 0.0005
SEARCH_TIMEOUT_MS = 10_000
FUNCTION_WORDS = ("the of and to in a is that for on with as by was are this be from at it an or "
                  "which we not were have has been can these their its also data results between "
                  "paper using such used other more one two all may than into only").split()
SYLLABLES = ("ka to re mi sa no lu de ra po ve tri gan sel mor bru cha len dis pra kol wen zy "
             "mar tes ol in ax um qu fe").split()
POLISH = str.maketrans("aeoczsln", "ąęóćżśłń")


def vocabulary(rng: random.Random) -> list[str]:
    words, seen = list(FUNCTION_WORDS), set(FUNCTION_WORDS)
    while len(words) < VOCABULARY:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        if rng.random() < 0.1:
            word = word.translate(POLISH)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def passages(rng: random.Random, words: list[str]) -> tuple[list[str], dict, list[str]]:
    """The passage pool, each word's passage count, and the planted phrases."""
    cumulative = list(itertools.accumulate(1 / r ** ZIPF_S for r in range(1, len(words) + 1)))
    total = cumulative[-1]
    draw = lambda: words[bisect.bisect(cumulative, rng.random() * total)]  # noqa: E731
    phrases = [f"{words[400 + 2 * n]} {words[401 + 2 * n]}" for n in range(5)]
    pool, counts = [], {}
    for _ in range(PASSAGES):
        chunk = [draw() for _ in range(PASSAGE_WORDS)]
        if rng.random() < PLANTED_SHARE:
            at = rng.randrange(PASSAGE_WORDS - 1)
            chunk[at:at + 2] = rng.choice(phrases).split()
        for word in set(chunk):
            counts[word] = counts.get(word, 0) + 1
        pool.append(" ".join(chunk))
    return pool, counts, phrases


def prepare(url: str, pages: int) -> None:
    papers = -(-pages // PAGES_PER_PAPER)
    with psycopg.connect(url) as conn:
        conn.execute("DROP INDEX ix_paper_pages_tsv")
        conn.execute("DROP INDEX ix_paper_pages_project_id")
        conn.execute(
            "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id) "
            "SELECT 'doi:10.1/bench.' || g, md5(g::text) || md5(g::text), 1, 'sha256/' || g, "
            "'bench-' || (1 + g %% 5) FROM generate_series(0, %s - 1) g", (papers,))
        conn.execute(
            "INSERT INTO paper_texts (canonical_key, project_id, pages, chars, languages) "
            "SELECT canonical_key, project_id, %s, 0, 'eng+pol' FROM assets", (PAGES_PER_PAPER,))


def load(url: str, pool: list[str], pages: int, budget_s: float, rng: random.Random) -> int:
    """COPY pages in batches until ``pages`` or the budget; the pages loaded."""
    started, loaded = time.perf_counter(), 0
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        while loaded < pages:
            batch_started = time.perf_counter()
            n = min(BATCH_PAGES, pages - loaded)
            with conn.cursor() as cur:
                with cur.copy("COPY paper_pages (canonical_key, page, project_id, body) "
                              "FROM STDIN") as copy:
                    for i in range(loaded, loaded + n):
                        paper = i // PAGES_PER_PAPER
                        copy.write_row((f"doi:10.1/bench.{paper}", 1 + i % PAGES_PER_PAPER,
                                        f"bench-{1 + paper % 5}",
                                        " ".join(rng.choices(pool, k=PASSAGES_PER_PAGE))))
            conn.commit()
            loaded += n
            elapsed = time.perf_counter() - started
            batch_s = time.perf_counter() - batch_started
            if loaded % 100_000 == 0 or loaded == pages:
                print(f"loaded {loaded} pages in {elapsed:.0f}s ({n / batch_s:.0f} pages/s)",
                      flush=True)
            if loaded < pages and elapsed + batch_s > budget_s:
                print(f"load budget {budget_s:.0f}s spent: stopping at {loaded} pages", flush=True)
                break
    return loaded


def build_indexes(url: str) -> None:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("CREATE INDEX ix_paper_pages_tsv ON paper_pages USING gin (tsv)")
        conn.execute("CREATE INDEX ix_paper_pages_project_id ON paper_pages (project_id)")
        conn.execute("VACUUM (ANALYZE) paper_pages")
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('paper_pages')), "
                            "pg_size_pretty(pg_relation_size('ix_paper_pages_tsv'))").fetchone()
    print(f"indexes and vacuum analyze: {time.perf_counter() - started:.0f}s; "
          f"paper_pages {size[0]}, GIN {size[1]}", flush=True)


def workload(words: list[str], counts: dict, phrases: list[str], rng: random.Random) -> dict:
    rare = [w for w in words[1000:] if 1 <= counts.get(w, 0) <= 3]
    kinds = {
        "rare": rng.sample(rare, 20),
        "common": words[:20],
        "phrase": [f'"{p}"' for p in phrases] * 4,
        "unlikely": [f'"{words[200 + n]} {words[300 + n]}"' for n in range(20)],
    }
    queries = {kind: [(q, None) for q in qs] for kind, qs in kinds.items()}
    # The project filter: a word on a tenth of the pages, in one of the 5 projects.
    queries["project"] = [(w, PROJECTS[n % 5]) for n, w in enumerate(words[60:80])]
    return queries


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def measure_search(url: str, queries: dict) -> dict:
    from app import create_app
    from app.extensions import db
    from app.search import query

    app = create_app({"DATABASE_URL": url, "LOG_JSON": False})
    timings: dict = {}
    with app.app_context():
        db.session.execute(db.text(f"SET statement_timeout = {SEARCH_TIMEOUT_MS}"))
        for kind in ("rare", "common", "unlikely"):
            plan = db.session.execute(db.text("EXPLAIN (ANALYZE, BUFFERS) " + str(query.SEARCH_ALL)), {
                "q": queries[kind][-1][0], "cap": query.CANDIDATE_PAGES + 1, "limit": 20, "offset": 0,
                "markers": query.HIT_START + query.HIT_STOP,
                "options": query.HEADLINE_OPTIONS}).scalars().all()
            print(f"plan of a {kind} search:\n  " + "\n  ".join(plan), flush=True)
            print(f"{kind}: the plan uses the GIN index: "
                  f"{any('ix_paper_pages_tsv' in line for line in plan)}", flush=True)
        for kind, qs in queries.items():
            for q, project in qs[:2]:
                query.search(q, project_id=project)  # warm-up
            samples = []
            for q, project in qs:
                started = time.perf_counter()
                found = query.search(q, project_id=project)
                samples.append((time.perf_counter() - started) * 1000)
            timings[kind] = samples
            print(f"search {kind}: p50 {statistics.median(samples):.1f} ms, "
                  f"p95 {percentile(samples, 0.95):.1f} ms (last: {found['total']}"
                  f"{'+' if found['total_is_lower_bound'] else ''} papers)", flush=True)
        db.session.remove()
    return timings


def measure_baseline(url: str, queries: dict) -> dict:
    timings: dict = {}
    statement = ("SELECT count(*) FROM (SELECT 1 FROM paper_pages WHERE tsv @@ "
                 "websearch_to_tsquery('fleethq_papers', %s) "
                 "AND (%s::text IS NULL OR project_id = %s) LIMIT 1001) s")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET statement_timeout = {SEARCH_TIMEOUT_MS}")
        for kind, qs in queries.items():
            for q, project in qs[:2]:
                conn.execute(statement, (q, project, project), prepare=False)
            samples = []
            for q, project in qs:
                started = time.perf_counter()
                conn.execute(statement, (q, project, project), prepare=False).fetchone()
                samples.append((time.perf_counter() - started) * 1000)
            timings[kind] = samples
            print(f"baseline {kind}: p50 {statistics.median(samples):.1f} ms, "
                  f"p95 {percentile(samples, 0.95):.1f} ms", flush=True)
    return timings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--load-budget-s", type=float, default=1800)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    started = time.perf_counter()
    words = vocabulary(rng)
    pool, counts, phrases = passages(rng, words)
    print(f"vocabulary {len(words)} words, {len(pool)} passages in "
          f"{time.perf_counter() - started:.0f}s", flush=True)

    name = "fleethq_bench_search"
    url = fresh_database(name)
    try:
        prepare(url, args.pages)
        pages = load(url, pool, args.pages, args.load_budget_s, rng)
        build_indexes(url)
        queries = workload(words, counts, phrases, rng)
        searched = measure_search(url, queries)
        baseline = measure_baseline(url, queries)
    finally:
        if not args.keep:
            with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    every = [t for samples in searched.values() for t in samples]
    every_baseline = [t for samples in baseline.values() for t in samples]
    p95, base_p95 = percentile(every, 0.95), percentile(every_baseline, 0.95)
    print(f"search pages={pages} p50_ms={statistics.median(every):.1f} p95_ms={p95:.1f} "
          f"baseline_p95_ms={base_p95:.1f} ratio={p95 / max(base_p95, 0.001):.2f}")


if __name__ == "__main__":
    main()
