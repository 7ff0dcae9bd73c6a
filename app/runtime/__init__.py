"""Composition roots: the API app, the worker, the `contextd` command, the embedded stack of
`contextd dev` and the tests, the process supervisor. Nothing else in `app` imports them."""
