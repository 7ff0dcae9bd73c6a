"""The web inspector at /inspect: server-rendered pages (no JavaScript) to look at a session."""
