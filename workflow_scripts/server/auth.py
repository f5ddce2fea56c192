"""`--api-key`, as SGLang checks it (`srt/utils.add_api_key_middleware`): every request needs
`Authorization: Bearer KEY`, except CORS preflights and the paths a supervisor polls (/health*, /metrics).

A pure ASGI middleware, so that a streaming route still learns when its client disconnects.
"""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from workflow_scripts.server.http_errors import error_body

OPEN_PREFIXES = ("/health", "/metrics")


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"].startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self._expected):
            reason = "a wrong API key" if given else "no API key"
            body = error_body(f"Unauthorized: {reason} (send 'Authorization: Bearer <--api-key>')", "Authorization", 401)
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
