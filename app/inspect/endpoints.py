"""Pages of the web inspector. The same keys as the API: an `Authorization: Bearer` header, or
the key entered once on the login page, for which an HttpOnly cookie holds a token signed for
that key (never the key itself, `app.auth.service.signed_token`); the key needs
`sessions:read` and sees its own tenant only. No key is asked for when auth is disabled (dev).
Headers and the same-origin check of the forms: `app.inspect.security`."""

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from app.auth.deps import get_caller
from app.auth.service import (
    authenticate,
    authenticate_signed_token,
    require_scope,
    signed_token,
)
from app.core.errors import ContextdError, NotFound, Unauthorized
from app.domain.callers import Caller, Scope
from app.domain.ids import is_session_id
from app.domain.text import shorten
from app.http.deps import ContextDep, DbDep, ReadDbDep
from app.inspect import service
from app.inspect.security import from_this_site

router = APIRouter(prefix="/inspect", include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).resolve().parent / "templates")
COOKIE = "contextd_inspector"
RAW_KEY_COOKIE = "contextd_key"  # earlier versions kept the key itself: dropped at sign-in
SIGN_IN_SECONDS = 12 * 3600  # a sign-in lasts a working day
OTHER_SITE = "this form was sent from a page of another site: sign in on this page"


def _ts(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


templates.env.filters["ts"] = _ts
# Previews cut between words, never inside an accented letter or a CJK character.
templates.env.filters["shorten"] = shorten


async def _caller(request: Request, db: DbDep, context: ContextDep) -> Caller:
    if context.settings.auth_disabled or request.headers.get("Authorization"):
        caller = await get_caller(request, db, context, None)
    else:
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            raise Unauthorized("no API key yet", field="Authorization")
        caller = await authenticate_signed_token(db, cookie, time.time())
    require_scope(caller, Scope.READ)
    return caller


def _login(request: Request, message: str, status_code: int) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "login.html", {"message": message}, status_code=status_code
    )


@router.get("", response_class=HTMLResponse)
async def sessions_page(
    request: Request,
    db: DbDep,
    reads: ReadDbDep,
    context: ContextDep,
    page: Annotated[int, Query(ge=1, le=10_000)] = 1,
) -> Response:
    try:
        caller = await _caller(request, db, context)
    except ContextdError as exc:
        return _login(request, exc.message, exc.status_code)
    rows, more = await service.sessions_list(reads, context, caller, page)
    return templates.TemplateResponse(
        request,
        "sessions.html",
        {"caller": caller, "rows": rows, "page": page, "more": more, "auth": _auth(context)},
    )


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
async def session_page(
    request: Request,
    session_id: str,
    db: DbDep,
    reads: ReadDbDep,
    context: ContextDep,
    build: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """A session, its stored builds first (`build`: the one shown in full, else the newest)."""
    try:
        caller = await _caller(request, db, context)
    except ContextdError as exc:
        return _login(request, exc.message, exc.status_code)
    try:
        if not is_session_id(session_id):
            raise NotFound(f"session {session_id!r} not found", field="session_id")
        page = await service.session_page(reads, context, caller, session_id, build)
    except NotFound as exc:
        return templates.TemplateResponse(
            request,
            "not_found.html",
            {"caller": caller, "message": exc.message, "auth": _auth(context)},
            status_code=404,
        )
    return templates.TemplateResponse(
        request, "session.html", {"caller": caller, "p": page, "auth": _auth(context)}
    )


@router.post("/login")
async def login(request: Request, db: DbDep) -> Response:
    if not from_this_site(request.headers):
        return _login(request, OTHER_SITE, status.HTTP_403_FORBIDDEN)
    form = parse_qs((await request.body()).decode(errors="replace"))
    key = (form.get("key") or [""])[0].strip()
    try:
        caller = await authenticate(db, f"Bearer {key}")
        require_scope(caller, Scope.READ)
    except ContextdError as exc:
        return _login(request, exc.message, exc.status_code)
    response = RedirectResponse("/inspect", status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE,
        signed_token(key, str(caller.key_id), int(time.time()) + SIGN_IN_SECONDS),
        max_age=SIGN_IN_SECONDS,
        path="/inspect",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    response.delete_cookie(RAW_KEY_COOKIE, path="/inspect")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not from_this_site(request.headers):
        return _login(request, OTHER_SITE, status.HTTP_403_FORBIDDEN)
    response = RedirectResponse("/inspect", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE, path="/inspect")
    return response


def _auth(context: ContextDep) -> str:
    return "disabled (dev)" if context.settings.auth_disabled else "API key"
