"""The OpenAI-compatible HTTP API (FastAPI). The endpoints and extensions are documented in docs/serving.md."""

from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenrouter.runtime.frontend.body import read_json_body
from tokenrouter.runtime.frontend.codec import TextCodec
from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.frontend.handlers import GenerationHandler
from tokenrouter.runtime.frontend.playground import PAGE_PATH, add_playground
from tokenrouter.runtime.frontend.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)
from tokenrouter.runtime.frontend.request_manager import RequestManager, starting_error

log = logging.getLogger("tokenrouter.frontend")

# everything else needs the API key when one is set (the playground page asks for it before any call)
_OPEN_PATHS = ("/health", "/metrics", PAGE_PATH)


# a subserver answers a start at once; a stop writes its trace first (seconds for a few seconds of steps; a
# long profile's trace can take minutes)
PROFILE_START_TIMEOUT_S = 60.0
PROFILE_STOP_TIMEOUT_S = 600.0


def build_app(args: FrontendArgs, codec: TextCodec) -> FastAPI:
    """The app; its RequestManager is created at startup (it needs the running loop) as app.state.manager."""
    app = FastAPI(
        title="TokenRouter", lifespan=_lifespan(args), docs_url=None, redoc_url=None, openapi_url=None
    )
    api = GenerationHandler(args, codec)
    add_error_handlers(app)
    if args.api_key:
        app.add_middleware(_ApiKeyMiddleware, key=args.api_key)
    add_status_routes(app, args, api)
    add_model_routes(app, args, api)
    add_profile_routes(app, args)
    add_playground(app, args)
    add_generation_routes(app, args, api)
    return app


def _lifespan(args: FrontendArgs):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        manager = RequestManager(
            args.endpoints,
            args.models,
            args.entry,
            remote=args.remote,
            heartbeat_timeout_s=args.heartbeat_timeout_s,
            liveness_timeout_s=args.liveness_timeout_s,
        )
        manager.metrics.plan_info = {"policy": args.policy, "routing": args.routing}
        manager.start()
        app.state.manager = manager
        yield
        await manager.close()

    return lifespan


def add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI-style JSON body: the API's own, an unknown path or method, and an internal one."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = {404: f"no such endpoint: {request.method} {request.url.path}", 405: "method not allowed"}
        err = APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail)))
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}").body(), status_code=500)


def add_status_routes(app: FastAPI, args: FrontendArgs, api: GenerationHandler) -> None:
    """/health, /metrics (Prometheus text) and /server_info."""

    @app.get("/health")
    async def health(request: Request) -> Response:
        mgr: RequestManager = request.app.state.manager
        if mgr.closing is not None:
            raise mgr.closing
        if mgr.fatal is not None:
            raise mgr.fatal_error()
        if not mgr.is_ready:
            raise APIError(503, "starting: not every subserver is ready yet", code="starting")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        mgr: RequestManager = request.app.state.manager
        return PlainTextResponse(mgr.metrics.render(mgr.n_active), media_type="text/plain; version=0.0.4")

    @app.get("/server_info")
    async def server_info(request: Request) -> dict:
        return _server_info(args, api, request.app.state.manager)


def _server_info(args: FrontendArgs, api: GenerationHandler, mgr: RequestManager) -> dict:
    return {
        "policy": args.policy,
        "entry": args.entry,
        "models": args.models,
        "max_model_len": api.max_len(mgr),
        "run_dir": args.run_dir,
        "endpoints": {k: v for k, v in args.endpoints.items() if k != "key"},  # the key stays secret
        "ready": mgr.is_ready,
        "subservers": {x: mgr.ready_models.get(x) for x in args.models},
    }


def add_model_routes(app: FastAPI, args: FrontendArgs, api: GenerationHandler) -> None:
    """/v1/models and /v1/models/{id}: the one model this server serves, the policy."""

    def model_card(request: Request) -> dict:
        return {
            "id": args.policy,
            "object": "model",
            "created": api.created,
            "owned_by": "tokenrouter",
            "root": args.policy,
            "max_model_len": api.max_len(request.app.state.manager),
        }

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        return {"object": "list", "data": [model_card(request)]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(request: Request, model_id: str) -> dict:
        if model_id != args.policy:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {args.policy!r}",
                           param="model", code="model_not_found")  # fmt: skip
        return model_card(request)


def add_profile_routes(app: FastAPI, args: FrontendArgs) -> None:
    """/start_profile and /stop_profile: a torch profile of every subserver, with --profile-dir."""

    @app.post("/start_profile")
    async def start_profile(request: Request) -> dict:
        mgr = _profilable(args, request.app.state.manager)
        await mgr.profile(True, args.profile_dir, PROFILE_START_TIMEOUT_S)
        return {"profiling": True, "models": args.models, "profile_dir": args.profile_dir}

    @app.post("/stop_profile")
    async def stop_profile(request: Request) -> dict:
        mgr = _profilable(args, request.app.state.manager)
        files = await mgr.profile(False, args.profile_dir, PROFILE_STOP_TIMEOUT_S)
        return {"profiling": False, "files": files}


def _profilable(args: FrontendArgs, mgr: RequestManager) -> RequestManager:
    if args.profile_dir is None:
        raise APIError(400, "profiling is off: start the server with --profile-dir DIR", code="profiling_off")
    if not mgr.is_ready:
        raise starting_error()
    return mgr


def add_generation_routes(app: FastAPI, args: FrontendArgs, api: GenerationHandler) -> None:
    """/v1/completions and /v1/chat/completions."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_json_body(request, args.max_body_bytes, args.body_timeout_s)
        return await api.serve(request, parse_body(CompletionRequest, body), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_json_body(request, args.max_body_bytes, args.body_timeout_s)
        return await api.serve(request, parse_body(ChatCompletionRequest, body), chat=True)


class _ApiKeyMiddleware:
    """`Authorization: Bearer KEY` on every path but /health, /metrics and the playground page. A plain ASGI
    middleware (Starlette's BaseHTTPMiddleware would hide client disconnects from the handlers)."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not secrets.compare_digest(auth, self.expected):
                err = APIError(
                    401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key"
                )
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
