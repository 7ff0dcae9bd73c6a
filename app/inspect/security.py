"""What keeps the inspector's pages to their own site: response headers that forbid framing,
scripts and content sniffing on every `/inspect` answer, and the same-origin check of its form
posts (a sign-in from another site's form would log the browser into the attacker's tenant).
"""

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/inspect"
# The pages are server-rendered HTML with inline CSS and inline SVG, and run no script at all:
# nothing but inline styles may load, no form posts elsewhere, no page may frame them.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers without CSP level 2
    (b"x-content-type-options", b"nosniff"),
    # Session ids in URLs go to no other site; not no-referrer, which makes a browser send
    # `Origin: null` with the pages' own form posts.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),  # a tenant's conversations stay out of shared caches
)


class InspectorHeaders:
    """Pure ASGI: `HEADERS` on every answer under `/inspect`, pages and refusals alike."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_hardened(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_hardened)


def from_this_site(headers: Headers) -> bool:
    """Whether a form post comes from a page of this server. Browsers say where a request comes
    from in `Sec-Fetch-Site` (else in `Origin`, sent with every POST); a client that sends
    neither is no browser, so no page of another site made it post. Of `Origin`, only host and
    port are compared: behind a proxy that ends TLS, the page is https, the request http."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")  # none: the user's own action (a bookmark)
    origin = headers.get("origin")
    if origin is None:
        return True
    host = headers.get("host", "").lower()
    return bool(host) and urlsplit(origin.lower()).netloc == host
