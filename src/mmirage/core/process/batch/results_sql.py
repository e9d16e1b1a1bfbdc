"""The SQL of the results store (``results_store.py`` tells what the tables hold).

A result is *stale* when its batch was submitted before the request's ``since`` (the time of
the request's latest first, non-retry, submission: its request line changed and was submitted
again under the same custom_id). A stale result answers an earlier version of the request: it
is never stored, never looked up, never listed as a failure, and anything replaces it.
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    provider TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    no INTEGER NOT NULL UNIQUE,
    processor TEXT,
    modality TEXT,
    spool_path TEXT,
    submitted_at TEXT NOT NULL DEFAULT '',
    request_count INTEGER NOT NULL DEFAULT 0,
    status TEXT,
    provider_status TEXT,
    fetched INTEGER NOT NULL DEFAULT 0,
    low INTEGER NOT NULL DEFAULT -1,
    high INTEGER NOT NULL DEFAULT -1,
    PRIMARY KEY (provider, batch_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests (
    source_index INTEGER NOT NULL,
    tag TEXT NOT NULL,
    batch_no INTEGER NOT NULL,
    since TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (source_index, tag)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS results (
    source_index INTEGER NOT NULL,
    tag TEXT NOT NULL,
    batch_no INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    text TEXT,
    kind TEXT,
    message TEXT,
    retryable INTEGER,
    input_tokens INTEGER,
    output_tokens INTEGER,
    finish_reason TEXT,
    PRIMARY KEY (source_index, tag)
) WITHOUT ROWID;
"""
# Columns added since the first release, with their type: a store an older mmirage made gets
# them when opened (its results read as NULL there; its requests' ``since`` as '': every
# result counts, as before).
ADDED_COLUMNS = {
    "results": (("finish_reason", "TEXT"),),
    "requests": (("since", "TEXT NOT NULL DEFAULT ''"),),
}

# The time a batch was submitted, by its number.
_AT = "(SELECT submitted_at FROM batches WHERE no = {})"
# The ``since`` of the request keyed (index, tag); '' (every result counts) without one.
_SINCE = "coalesce((SELECT since FROM requests WHERE source_index = {} AND tag = {}), '')"

# ?1 index, ?2 tag, ?3 batch number, ?4 1 for a resubmission (``retry``), else 0, ?5 the
# batch's submitted_at (the caller has it: one lookup less per request).
# A newer submission (by its receipt's time) becomes the request's latest one; a first
# submission moves ``since`` up to its time, whatever order the receipts are read in (run ids
# are random: receipt files are not read in time order); a resubmission keeps it.
UPSERT_REQUEST = f"""
INSERT INTO requests (source_index, tag, batch_no, since)
VALUES (?1, ?2, ?3, CASE WHEN ?4 THEN '' ELSE ?5 END)
ON CONFLICT (source_index, tag) DO UPDATE SET
    batch_no = CASE WHEN ?5 >= {_AT.format("requests.batch_no")}
                    THEN excluded.batch_no ELSE requests.batch_no END,
    since = CASE WHEN ?4 THEN requests.since ELSE max(requests.since, excluded.since) END
"""

# ``batch_records.result_line``'s columns, as ?1..?11 (?3 the batch number, ?4 ok). A stale
# row is never stored; a success is never replaced by a failure, unless the success is stale;
# anything else takes the newer row.
_UPSERT_RESULT = f"""
INSERT INTO results (source_index, tag, batch_no, ok, text, kind, message, retryable,
                     input_tokens, output_tokens, finish_reason)
{{values}}
ON CONFLICT (source_index, tag) DO UPDATE SET
    batch_no = excluded.batch_no, ok = excluded.ok, text = excluded.text,
    kind = excluded.kind, message = excluded.message, retryable = excluded.retryable,
    input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
    finish_reason = excluded.finish_reason
WHERE excluded.ok = 1 OR results.ok = 0
   OR {_AT.format("results.batch_no")} < {_SINCE.format("excluded.source_index", "excluded.tag")}
"""
_VALUES = "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11"
UPSERT_RESULT = _UPSERT_RESULT.format(
    values=f"SELECT {_VALUES} WHERE {_AT.format('?3')} >= {_SINCE.format('?1', '?2')}"
)
# The same for lines that cannot be stale: no request of theirs was first submitted after
# their batch (``ResultsStore`` knows from the batches' times and row spans). The common
# case, in half the time: no two lookups per row, no SELECT to filter them, and
# ``LINES_PER_UPSERT`` lines a statement (SQLite upserts them one after the other, in order).
UPSERT_CURRENT_RESULT = _UPSERT_RESULT.format(values=f"VALUES ({_VALUES})")
LINES_PER_UPSERT = 20
UPSERT_CURRENT_RESULTS = _UPSERT_RESULT.format(
    values="VALUES " + ", ".join([f"({', '.join('?' * 11)})"] * LINES_PER_UPSERT)
)

# Requests of a terminal batch that it returned no result for: recorded as that batch's
# failure (expired, canceled, failed as a whole, or simply missing), never over a success
# (but over a stale one). ?1 kind, ?2 message, ?3..?4 the batch's row span, ?5 its number.
MARK_UNANSWERED = f"""
INSERT INTO results (source_index, tag, batch_no, ok, kind, message, retryable)
SELECT q.source_index, q.tag, q.batch_no, 0, ?1, ?2, 1 FROM requests AS q
WHERE q.source_index BETWEEN ?3 AND ?4 AND q.batch_no = ?5 AND NOT EXISTS (
    SELECT 1 FROM results AS r
    WHERE r.source_index = q.source_index AND r.tag = q.tag AND r.batch_no = q.batch_no)
ON CONFLICT (source_index, tag) DO UPDATE SET
    batch_no = excluded.batch_no, ok = 0, text = NULL, kind = excluded.kind,
    message = excluded.message, retryable = 1, input_tokens = NULL, output_tokens = NULL,
    finish_reason = NULL
WHERE results.ok = 0
   OR {_AT.format("results.batch_no")} < {_SINCE.format("excluded.source_index", "excluded.tag")}
"""

# Each request of the row span with its ``since`` and its latest result, if any: the caller
# drops a stale one (it holds every batch's time; a subquery per row here cost a quarter of
# the query).
OUTCOME_LINES = """
SELECT q.source_index, q.tag, q.batch_no, q.since, r.batch_no, r.ok, r.text, r.kind,
       r.message, r.retryable, r.input_tokens, r.output_tokens, r.finish_reason
FROM requests AS q LEFT JOIN results AS r
    ON r.source_index = q.source_index AND r.tag = q.tag
WHERE q.source_index {where}
"""

# Every request whose latest result is a failure, not stale, by its latest batch.
FAILED_REQUESTS = f"""
SELECT q.batch_no, q.source_index, q.tag, r.retryable FROM requests AS q
JOIN results AS r ON r.source_index = q.source_index AND r.tag = q.tag
WHERE r.ok = 0 AND {_AT.format("r.batch_no")} >= q.since ORDER BY q.batch_no
"""
