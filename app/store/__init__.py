"""Every table's SQL, one module per table group: the mapping (`models`), sessions and turns,
chunks and the vector index, remembered items, scratchpads, builds, erase receipts, API keys.
The engines and flows above call these functions; nothing here decides product behaviour."""
