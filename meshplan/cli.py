"""The `meshplan` command: one subcommand per MCP tool, same option names, `--json` for the structured result.

All logic lives in `meshplan.api`; this module parses flags, prints, and maps errors to exit codes
(2: bad input, 1: `check` found an error). No traceback reaches a user for a bad request.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from meshplan.errors import MeshplanError
from meshplan.schema import Request

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_request_flags(parser: argparse.ArgumentParser, *, model_positional: bool = True) -> None:
    """One flag per request field (hyphenated), with the field's description as help."""
    if model_positional:
        parser.add_argument("model_pos", nargs="?", metavar="MODEL", help=Request.model_fields["model"].description)
    for name, field in Request.model_fields.items():
        annotation = field.annotation
        args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
        kind = args[0]
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": field.description}
        choices = get_args(kind) if getattr(kind, "__origin__", None) is not None else ()
        if choices and all(isinstance(c, str) for c in choices):
            kwargs["choices"] = list(choices)
        elif kind is bool:
            kwargs.update(type=_bool, metavar="{true,false}")
        elif kind is int:
            kwargs["type"] = int
        parser.add_argument(_flag(name), **kwargs)


def request_from_args(args: argparse.Namespace) -> Request:
    values = {name: getattr(args, name) for name in Request.model_fields if getattr(args, name, None) is not None}
    positional = getattr(args, "model_pos", None)
    if positional and "model" not in values:
        values["model"] = positional
    if "model" not in values:
        raise MeshplanError("A model is required.", fix="Pass MODEL or --model (see 'meshplan models').")
    return Request.model_validate(values)


def _emit(result: Any, as_json: bool, table: Callable[[Any], None]) -> None:
    if as_json:
        if isinstance(result, BaseModel):
            print(result.model_dump_json(indent=2))
        else:
            print(json.dumps(result, indent=2, default=_jsonable))
    else:
        table(result)


def _jsonable(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else str(value)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "request"
        parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return "Invalid request: " + "; ".join(parts)


# --------------------------------------------------------------------------- subcommands


def cmd_describe(args: argparse.Namespace) -> int:
    from meshplan import api, display

    model = args.model or args.model_pos
    if not model:
        raise MeshplanError("describe needs a model.", fix="meshplan describe llama-3.1-8b")
    _emit(api.describe_model(model), args.json, display.model_report)
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from meshplan import api, display

    models = api.list_models()
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in models], indent=2))
    else:
        display.model_list(models)
    return EXIT_OK


def _batch(args: argparse.Namespace, run: Callable[[Request], BaseModel]) -> int:
    """One request per JSON line in, one JSON result per line out; a bad line gets {"error": ...}."""
    source = sys.stdin if args.batch == "-" else open(args.batch, encoding="utf-8")
    with source:
        for line in source:
            if not line.strip():
                continue
            try:
                req = Request.model_validate(json.loads(line))
                print(run(req).model_dump_json())
            except ValidationError as exc:
                print(json.dumps({"error": _validation_message(exc)}))
            except json.JSONDecodeError as exc:
                print(json.dumps({"error": f"not a JSON object: {exc}"}))
            except MeshplanError as exc:
                print(json.dumps({"error": str(exc)}))
    return EXIT_OK


def _request_command(run_name: str, table_name: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from meshplan import api, display

        run = getattr(api, run_name)
        if getattr(args, "batch", None):
            return _batch(args, run)
        result = run(request_from_args(args))
        _emit(result, args.json, getattr(display, table_name))
        if run_name == "check_config" and not result.ok:
            return EXIT_FINDINGS
        return EXIT_OK

    return command


def cmd_recommend(args: argparse.Namespace) -> int:
    from meshplan import api, display

    result = api.recommend(request_from_args(args), top_k=args.top_k)
    _emit(result, args.json, display.recommendation)
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    from meshplan import api

    req = request_from_args(args)
    options = {k: v for k, v in {"variant": args.variant, "version": args.version}.items() if v}
    result = api.render_config(args.target, req, **options)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(result.text, end="" if result.text.endswith("\n") else "\n")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from meshplan.mcp_server.server import run

    run(transport=args.transport, host=args.host, port=args.port)
    return EXIT_OK


def cmd_docs(args: argparse.Namespace) -> int:
    from meshplan import docs

    drift = docs.render_all(check=args.check)
    if args.check and drift:
        for path in drift:
            print(f"out of date with its cards: {path} (run 'meshplan docs')", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshplan",
        description="Plan and check the parallel layout (TP/PP/CP/EP/DP) of an LLM training job.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("describe", help="Parameter counts of a model, exact from its config")
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help=Request.model_fields["model"].description)
    p.add_argument("--model", default=None, help="Same as MODEL")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("models", help="List the model catalog")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_models)

    for name, run, table, text in [
        ("memory", "estimate_memory", "memory_report", "Per-GPU memory per pipeline stage, with a breakdown"),
        ("throughput", "estimate_throughput", "throughput_report", "Step time, tokens/s per GPU and MFU"),
        ("check", "check_config", "check_report", "Check a layout against the framework's rules (exit 1 on error)"),
    ]:
        p = sub.add_parser(name, help=text)
        add_request_flags(p)
        p.add_argument("--json", action="store_true", help="Print the structured result")
        p.add_argument("--batch", metavar="FILE.jsonl", help="One request per JSON line ('-' for stdin)")
        p.set_defaults(func=_request_command(run, table))

    p = sub.add_parser("recommend", help="Search every valid layout and rank those that fit by speed")
    add_request_flags(p)
    p.add_argument("--top-k", type=int, default=5, help="How many layouts to return")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("render", help="Emit the plan as a framework config snippet")
    p.add_argument("target", metavar="FRAMEWORK", help="megatron-bridge, megatron-core, verl, skyrl, torchtitan, "
                   "kempnerforge or deepspeed")
    add_request_flags(p)  # FRAMEWORK MODEL [flags]
    p.add_argument("--variant", default=None, help="Framework-specific form (e.g. verl: megatron|fsdp; skyrl: rl|sft)")
    p.add_argument("--version", default=None, help="Framework version to target (e.g. torchtitan 0.2)")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("serve", help="Run the MCP server (stdio by default)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (loopback unless told otherwise)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("docs", help="Render the skill tables from the cards (--check: fail on drift)")
    p.add_argument("--check", action="store_true")
    p.set_defaults(func=cmd_docs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValidationError as exc:
        print(f"meshplan: {_validation_message(exc)}", file=sys.stderr)
    except MeshplanError as exc:
        print(f"meshplan: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"meshplan: {exc}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
