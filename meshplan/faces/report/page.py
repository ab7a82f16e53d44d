"""The page `meshplan serve --transport http` serves at `/`: a form (a catalog model or a pasted config.json, GPU,
count, framework, sequence length, global batch, precision, job, and any of tp, pp, cp, ep to hold fixed) whose
answer is recommend's, drawn as the report.

It holds no arithmetic: the answer is `report.gather(..., recommend=True)`, the same api call as `meshplan report
--recommend` and `meshplan recommend --json` (whose JSON the page prints under the pictures). It binds where the
MCP endpoint binds (loopback by default) and answers only requests that pass the same Host/Origin checks; the
page itself loads nothing from anywhere (inline CSS, no script).
"""

from __future__ import annotations

import re
from typing import Any, get_args
from urllib.parse import parse_qs

import anyio.to_thread
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from pydantic import ValidationError
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshplan import __version__, api
from meshplan.core.errors import MeshplanError, closest
from meshplan.faces.report.gather import gather
from meshplan.faces.report.render import environment, render_html
from meshplan.knowledge.hardware import gpu_catalog
from meshplan.knowledge.model_config import CONFIG_TEXT_NAME
from meshplan.request.parse import parse_request, request_error
from meshplan.schema.choices import FRAMEWORKS, JobKind, Precision
from meshplan.schema.request import Request

PAGE_PATHS = ("/", "/index.html")
MAX_FORM_BYTES = 1 << 20  # a config.json is a few kilobytes; a larger form is refused before it is read whole
FORM_FIELDS = ("model", "config", "gpu", "num_gpus", "framework", "seq_length", "global_batch_size", "precision", "job",
               "tp", "pp", "cp", "ep")
"""The page form's inputs (page.html.j2); the page answers recommend for these alone, a degree left empty searched
(the request fields of the same names: an empty field is not sent, so the request's default or the search holds)."""
WHOLE_NUMBERS = ("num_gpus", "seq_length", "global_batch_size", "tp", "pp", "cp", "ep")
CHOICES = {"precision": get_args(Precision), "job": get_args(JobKind)}  # the form's selects: the request's literals


# C0 and C1 control characters and DEL, but the tab and line breaks a pasted config.json holds: a NUL or a terminal
# escape in a form field is no model, GPU or count, and echoed into the page it reaches the user's browser and clipboard
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _form_values(form: dict[str, list[str]]) -> dict[str, str]:
    """The form's non-empty fields, every one: a field the form does not have is refused by _request_fields (this
    kept FORM_FIELDS alone, so `GET /?vpp=3` through the page's route was answered as if vpp were searched)."""
    return {k: v[0].strip() for k, v in form.items() if v and v[0].strip()}


def _control_characters(values: dict[str, str]) -> str:
    """The refusal of a form whose fields hold control characters ('' when none does), each field named with its
    first one's code point and place."""
    found = [f"{k} holds U+{ord(m.group()):04X} at character {m.start() + 1}"
             for k, v in values.items() if (m := CONTROL.search(v))]
    return (f"The form's {'; '.join(found)}: a field is text without control characters (a pasted config.json may "
            "hold tabs and line breaks). Fix: remove them (a paste from a terminal can carry escapes) and send the "
            "form again.") if found else ""


def _request_fields(values: dict[str, str]) -> dict[str, Any]:
    """The form as request fields; a pasted config.json is the model, as its text."""
    unknown = [k for k in values if k not in FORM_FIELDS]
    if unknown:  # a hand-made URL (?tp=2) would otherwise be answered as if tp were searched
        # a request field the form lacks (?vpp=3) is meant as it is: no form field's spelling to offer for it
        hint = (" (a request field the form does not hold)" if unknown[0] in Request.model_fields else
                "".join(f" (did you mean {h!r}?)" for h in closest(unknown[0], FORM_FIELDS, n=1)))
        raise MeshplanError(f"The page has no field {unknown[0][:40]!r}{hint}; it takes {', '.join(FORM_FIELDS)}.",
                            fix="Set the request's other fields (vpp, micro_batch_size, recompute ...) with the CLI "
                                "(meshplan report) or the MCP tools.")
    fields: dict[str, Any] = {k: v for k, v in values.items() if k != "config"}
    for name in WHOLE_NUMBERS:  # a form sends text; a signed whole number in ASCII digits is one (the CLI's and the
        # api's reading: '１６' was answered for 16 GPUs, which both refuse)
        if re.fullmatch(r"[+-]?[0-9]+", fields.get(name, "")):
            fields[name] = int(fields[name])  # (-8 is below 1, not 'no integer'); the parser names the rest
    if "config" in values:  # the model is the config.json's text, read as such (no file: knowledge/model_config.py)
        fields["model"] = values["config"]
    if "model" not in fields:
        raise MeshplanError("No model given.", fix="Pick a catalog model or paste a config.json.")
    return fields


PASTED = CONFIG_TEXT_NAME  # the model's name on the page when a config.json is pasted


def answer(values: dict[str, str]) -> tuple[str, str, str]:
    """(report body, recommend's JSON, error) for the form's values: the same call as `meshplan report
    --recommend` (an error is a MeshplanError's words, never a traceback). A pasted config.json is the model as its
    text, named PASTED; a path typed as the model is the server's file, refused for a remote caller unless its
    operator opened the folder (--allow-server-files)."""
    try:
        req = parse_request(_request_fields(values))
        report = gather(req, recommend=True)
    except ValidationError as exc:
        return "", "", str(request_error(exc))
    except MeshplanError as exc:
        return "", "", str(exc)
    rec = report.recommendation
    return render_html(report, fragment=True), rec.model_dump_json(indent=2) if rec else "", ""


def page(values: dict[str, str]) -> str:
    """The page for the form's values; a form with control characters is refused, and echoed without them."""
    if refused := _control_characters(values):
        values = {k: CONTROL.sub("", v) for k, v in values.items()}
        body, answer_json, error = "", "", refused
    else:
        body, answer_json, error = answer(values) if values else ("", "", "")
    models = [m.key for m in api.list_models()]
    return environment().get_template("page.html.j2").render(
        values=values, models=models, gpus=sorted(gpu_catalog()), frameworks=list(FRAMEWORKS), choices=CHOICES,
        body=body, answer_json=answer_json, error=error, version=__version__)


class PageRouter:
    """ASGI: `/` (GET, or POST with a form) is the page; every other path goes to the MCP app unchanged."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings | None):
        self.app = app
        self.security = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PAGE_PATHS:
            await self.app(scope, receive, send)
            return
        request = HttpRequest(scope, receive)
        refused = await self.security.validate_request(request, is_post=False)  # Host and Origin, as for /mcp
        if refused is None:
            refused = await self._respond(request)
        if request.method == "HEAD":  # GET's answer, its headers (Content-Length too), and no body
            send = _headers_only(send)
        await refused(scope, receive, send)

    async def _respond(self, request: HttpRequest) -> Response:
        if request.method in ("GET", "HEAD"):  # HEAD: what monitoring and link checkers send
            form = parse_qs(request.url.query)
        elif request.method == "POST":
            declared = request.headers.get("content-length", "")
            if not declared.isdigit() or int(declared) > MAX_FORM_BYTES:
                return Response(f"A form is at most {MAX_FORM_BYTES:,} bytes with a Content-Length", 413)
            form = parse_qs((await request.body())[:MAX_FORM_BYTES].decode("utf-8", "replace"))
        else:
            return Response("Method not allowed: use GET, HEAD or POST", 405, headers={"Allow": "GET, HEAD, POST"})
        html = await anyio.to_thread.run_sync(page, _form_values(form))
        return HTMLResponse(html, headers={"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                                                      "img-src data:; form-action 'self'"})


def _headers_only(send: Send) -> Send:
    """`send` with each body message emptied: a HEAD answer is GET's headers alone (RFC 9110 9.3.2)."""
    async def headers_only(message: Message) -> None:
        await send({**message, "body": b""} if message["type"] == "http.response.body" else message)
    return headers_only
