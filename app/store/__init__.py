"""Every table's SQL, one module per table group: the mapping (`models`), sessions and turns,
chunks and the vector index, remembered items, scratchpads, builds, erase receipts, API keys.
The engines and flows above call these functions; nothing here decides product behaviour.

Lock order. Every transaction that takes more than one lock takes them in this order, so no two
transactions wait on each other in a cycle (a PostgreSQL deadlock):

1. session rows, `SELECT ... FOR UPDATE` (`lock_session_by_pk`, `lock_or_create_session`), and
   several of them in one statement in primary-key order (`lock_sessions`), never one more
   after rows of step 2 or 3 were written;
2. rows of those sessions: turns, chunks, the scratchpad (notes);
3. remembered items (`memories`), after the session rows that hold them.

Offloads (the worker's, an append's or a build's inline one, the memory tool's), forget and
session / user erase (`app.erasure`), notes writes, remember and the sweep's recount all lock the
session row first. A path that must touch several sessions reads which ones without locks, then
locks them all at once (`lock_sessions`). A deadlock or serialization failure that still happens
is retried (`app.core.db.retrying_transaction`).
"""
