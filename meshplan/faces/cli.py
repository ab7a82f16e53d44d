"""The `meshplan` command: one subcommand per MCP tool, same option names, `--json` for the structured result.

All logic lives in `meshplan.api`; this module parses flags, prints, and maps errors to exit codes
(2: bad input, 1: `check` found an error). No traceback reaches a user for a bad request.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from meshplan import __version__, api
from meshplan.adapters.capabilities import renderable_frameworks
from meshplan.core.errors import MeshplanError, closest
from meshplan.core.units import plural
from meshplan.faces.mcp import ALLOW_SERVER_FILES_HELP, start_up
from meshplan.request.parse import (
    ascii_float,
    ascii_int,
    field_aliases,
    framework_variant_hint,
    likely_field,
    parse_request,
    request_error,
)
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.options import MinimumGpusOptions, RecommendOptions, ReportOptions
from meshplan.schema.reports import MinimumGpus, Recommendation
from meshplan.schema.request import Request

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # the shell's status for a process ended by Ctrl-C (SIGINT)
OptionsT = TypeVar("OptionsT", bound=BaseModel)
BATCH_HELP = ("One request per JSON line ('-' for stdin); one output line per input line, "
              '{"line": N, ...result} or {"line": N, "error": ...}; exit 2 if a line fails')
EXIT_BROKEN_PIPE = 141  # the shell's status for a writer whose reader went away (SIGPIPE), as `yes | head` gives


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default when it has one to show (not None, not an off switch) and its help does not."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in (action.help or "").lower():
            return action.help or ""
        return super()._get_help_string(action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrap without breaking a hyphenated name (nemo-automodel, megatron-bridge) across lines."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


SHORT_FLAG = re.compile(r"-[A-Za-z][\w-]*")  # '-n', '-tp': a single-dash flag (a negative number is a value)


class Parser(argparse.ArgumentParser):
    """argparse with short usage errors: the flag, the value, the closest valid one and that flag's choices."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            allowed = [str(c) for c in action.choices]
            if action.dest == "framework" and (said := framework_variant_hint(value)):
                raise argparse.ArgumentError(action, said.replace("framework=", "--framework ").replace(
                    "variant=", "--variant "))
            hints = closest(str(value), allowed, n=1)
            hint = f"did you mean {hints[0]!r}? " if hints else ""
            raise argparse.ArgumentError(
                action, f"invalid choice {str(value)[:80]!r}; {hint}choose from {', '.join(allowed)}")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """Refuse an unknown flag before reading any value, as the api and MCP refuse an unknown field before
        checking values: the first error is the same on every face (argparse reads values first and names
        unknown flags last, without the subcommand or a hint)."""
        argv = list(sys.argv[1:] if args is None else args)
        self._refuse_unknown_flags(argv)
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:  # argparse said this from the top ('meshplan: error: ... (see 'meshplan --help')')
            found = self._subcommand(argv)
            (found[1] if found else self).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _subcommand(self, argv: list[str]) -> tuple[int, argparse.ArgumentParser] | None:
        """(its place in argv, its parser) of the subcommand argv names; None before one is named."""
        commands = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        at = next((i for i, token in enumerate(argv) if commands and token in commands), None)
        return None if commands is None or at is None else (at, commands[argv[at]])

    def _refuse_unknown_flags(self, argv: list[str]) -> None:
        found = self._subcommand(argv)
        if found is None:
            return  # no subcommand yet: argparse says what is missing
        at, sub = found
        known = [o for o in sub._option_string_actions if o.startswith("--")]
        for token in argv[at + 1:]:
            if token == "--":
                return
            if SHORT_FLAG.fullmatch(token) and token not in sub._option_string_actions:  # '-n 8': argparse took it
                # for a flag and named it from the top, without the subcommand or the flag it likely means
                field = likely_field(token[1:], [o[2:].replace("-", "_") for o in known])
                sub.error(f"unknown flag {token!r}" + (f" (did you mean {_flag(field)!r}?)" if field else ""))
            name = token.split("=", 1)[0]
            abbreviates = sub.allow_abbrev and any(o.startswith(name) for o in known)  # argparse takes a unique prefix
            # a prefix that is another field's synonym is that field's, as parse_request reads it ('--gpus 8' set
            # gpus_per_node, an abbreviation of --gpus-per-node, where the api refuses 'gpus' for num_gpus)
            alias = field_aliases().get(name[2:].replace("-", "_"))
            if abbreviates and alias is not None and not _flag(alias).startswith(name) and _flag(alias) in known:
                sub.error(f"unknown flag {name!r} (did you mean {_flag(alias)!r}?)")
            if not name.startswith("--") or name in known or abbreviates:
                continue
            field = likely_field(name[2:], [o[2:].replace("-", "_") for o in known])
            hint = f" (did you mean {_flag(field)!r}?)" if field else ""
            sub.error(f"unknown flag {name!r}{hint}")

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see '{self.prog} --help')\n")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A flag's text through the parser's ASCII-digits reading, its error shown as argparse shows a usage error."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _field_help(name: str) -> str:
    """A field's description with its default (or what leaving it unset means), for --help. argparse expands
    %-formats in help text, so a description's own '%' is escaped (else --help itself fails)."""
    field = Request.model_fields[name]
    text = (field.description or "").replace("%", "%%")
    if "default" in text.lower():
        return text
    if field.is_required():
        return f"{text} (required: this or MODEL)"
    default = field.default if field.default is not None else "unset"
    return f"{text} (default: {default})"


def _value_type(annotation: Any) -> Any:
    """The type inside `X | None`; any other annotation (a Literal included) as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def add_request_flags(parser: argparse.ArgumentParser, *, model_positional: bool = True) -> None:
    """One flag per request field (hyphenated), with the field's description, default and choices as help."""
    if model_positional:
        parser.add_argument("model_pos", nargs="?", metavar="MODEL", help=Request.model_fields["model"].description)
    for name, field in Request.model_fields.items():
        kind = _value_type(field.annotation)
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _field_help(name)}
        if get_origin(kind) is list:  # a list of names (recompute_modules): one flag, several values
            kwargs["nargs"] = "+"
            kind = get_args(kind)[0]
        choices = get_args(kind) if get_origin(kind) is not None else ()
        if choices and all(isinstance(c, str) for c in choices):
            kwargs["choices"] = list(choices)
        elif kind is bool:
            kwargs.update(type=_bool, metavar="{true,false}")
        elif kind is int:
            kwargs.update(type=_typed(ascii_int), metavar="N")
        elif kind is float:
            kwargs.update(type=_typed(ascii_float), metavar="X")
        parser.add_argument(_flag(name), **kwargs)
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="Start from a framework config or launch script (a Megatron-LM/DeepSpeed/Bridge/verl/"
                             "SkyRL/torchtitan shell script, a torchtitan or KempnerForge TOML, a ds_config JSON): "
                             "its fields, as `meshplan import FILE` shows them; flags given beside it override it "
                             "(default: none, the flags alone)")


def request_from_args(args: argparse.Namespace, scan_gpus: bool = False) -> Request:
    """The flags as a `Request`, through the same parser as MCP arguments and batch lines (`scan_gpus`: min-gpus,
    a --config file's GPU count left out)."""
    values = {name: getattr(args, name) for name in Request.model_fields if getattr(args, name, None) is not None}
    positional = getattr(args, "model_pos", None)
    if positional and values.get("model", positional) != positional:
        raise MeshplanError(
            f"Two different models given: MODEL {positional!r} and --model {values['model']!r}.",
            fix="Give the model once, as MODEL or as --model.",
        )
    if positional:
        values["model"] = positional
    if getattr(args, "config", None):  # the file's fields, the flags over them; the file's framework is --framework
        # or detected, never render's FRAMEWORK, the one the plan is written for, as render_config reads config_text
        # (`render deepspeed --config torchtitan.toml` was refused as no DeepSpeed file where MCP rendered it)
        imported = api.import_file(args.config, framework=values.get("framework"))
        return api.request_from_config(imported, values, scan_gpus=scan_gpus)
    return parse_request(values)


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


# --------------------------------------------------------------------------- subcommands


def cmd_describe(args: argparse.Namespace) -> int:
    from meshplan.faces import display

    if args.model and args.model_pos and args.model != args.model_pos:
        raise MeshplanError(f"Two different models given: MODEL {args.model_pos!r} and --model {args.model!r}.",
                            fix="Give the model once, as MODEL or as --model.")
    model = args.model or args.model_pos or ""  # none given: api.describe_model's refusal, every face's words
    _emit(api.describe_model(model), args.json, display.model_report)
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from meshplan.faces import display

    models = api.list_models()
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in models], indent=2))
    else:
        display.model_list(models)
    return EXIT_OK


MAX_LINE_CHARS = 1 << 20  # a request is a few hundred characters; a longer line is refused, not parsed
ECHO_CHARS = 200  # how much of a bad line an error repeats


def _echo(text: str) -> str:
    """A bad input as an error shows it: at most ECHO_CHARS of it, so a huge line is never repeated whole."""
    text = text.strip()
    return repr(text) if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]!r}... ({len(text):,} characters)"


def _lines(source: IO[str], limit: int) -> Iterator[tuple[str, int]]:
    """Each line of `source` with its full length; past `limit` characters a line is skipped in chunks, unkept."""
    while line := source.readline(limit + 1):
        length, rest = len(line), line
        while length > limit and not rest.endswith("\n") and (rest := source.readline(limit)):
            length += len(rest)
        yield line, length - rest.endswith("\n")


def _batch_result(text: str, length: int, run: Callable[[dict[str, Any]], BaseModel]) -> BaseModel:
    """The answer to one batch line, or a MeshplanError saying what is wrong with the line."""
    example = 'one JSON object per line, e.g. {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2}'
    if length > MAX_LINE_CHARS:
        raise MeshplanError(f"The line is {length:,} characters long, starting {text[:ECHO_CHARS]!r}...",
                            fix=f"A request is at most {MAX_LINE_CHARS:,} characters; {example}.")
    if not text.strip():
        raise MeshplanError("Blank line: no request.", fix=f"Remove it or put a request there: {example}.")
    try:
        values = json.loads(text, object_pairs_hook=_one_value_per_field)
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"Not JSON ({exc.msg} at column {exc.colno}): {_echo(text)}.", fix=example) from None
    except MeshplanError:
        raise
    except (ValueError, RecursionError):  # nested too deep, or a number too long to convert
        raise MeshplanError(f"Not a readable JSON request: {_echo(text)}.", fix=example) from None
    if not isinstance(values, dict):  # a JSON list or number: parse_request names what a line must be
        return run(parse_request(values))
    return run(values)


def _one_value_per_field(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of a batch line; a field given twice ({"num_gpus": 8, "num_gpus": 16} ran at 16, json's last
    value) is two answers to one question, refused."""
    values: dict[str, Any] = {}
    for name, value in pairs:
        if name in values and values[name] != value:
            raise MeshplanError(f"{name} is given twice, as {values[name]!r} and {value!r}.",
                                fix=f"Give {name} once per line.")
        values[name] = value
    return values


def _error_line(number: int, message: str) -> str:
    return json.dumps({"line": number, "error": message}, separators=(",", ":"))


def _batch(args: argparse.Namespace, run: Callable[[dict[str, Any]], BaseModel],
           found_nothing: Callable[[BaseModel], bool] = lambda result: getattr(result, "ok", True) is False) -> int:
    """One request per JSON line in; out, one JSON line per input line, in order, each with its line number.

    `{"line": N, ...result...}` or `{"line": N, "error": ...}` (a blank or unreadable line too, so output line N
    answers input line N). `run` answers a line's JSON object (its request fields, and the command's own options
    where it takes them, as the MCP tool does). Exit 2 when any line is an error, else 1 when any answer is
    `found_nothing` (a check that found an error, a recommend that ranked nothing, a min-gpus that found no count),
    else 0.
    """
    given = [_flag(name) for name in Request.model_fields if getattr(args, name, None) is not None]
    if args.config:  # a line's request does not start from the file (answered as if --config were not there)
        given.insert(0, f"--config {args.config}")
    if args.model_pos or given:
        raise MeshplanError(f"--batch takes every request from {args.batch}; {args.model_pos or given[0]} would be "
                            "ignored.", fix="Put the fields in each JSON line, or drop --batch.")
    if args.batch == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        source = io.TextIOWrapper(stdin, encoding="utf-8-sig", errors="replace") if stdin else sys.stdin
    else:
        try:
            source = open(args.batch, encoding="utf-8-sig", errors="replace")  # bad bytes: a JSON error, per line
        except OSError as exc:  # a folder or a missing file: said as every other file flag says it, not as Errno
            raise MeshplanError(f"Cannot read the batch file {args.batch}: {exc.strerror or exc}.",
                                fix="Pass --batch a file of JSON requests, one per line, or - for stdin.") from None
    status, lines = EXIT_OK, 0
    try:
        for number, (text, length) in enumerate(_lines(source, MAX_LINE_CHARS), start=1):
            lines = number
            try:
                result = _batch_result(text, length, run)
            except MeshplanError as exc:
                out, status = _error_line(number, str(exc)), EXIT_USAGE
            except Exception as exc:  # a fault on one line must not lose the answers to the others
                reason = f"internal error ({type(exc).__name__}: {str(exc)[:ECHO_CHARS]}); please report it"
                out, status = _error_line(number, reason), EXIT_USAGE
            else:
                out = f'{{"line":{number},' + result.model_dump_json()[1:]  # the result's own fields follow
                if found_nothing(result):
                    status = max(status, EXIT_FINDINGS)
            print(out)
        if not lines:  # stdout stays JSON lines (none here); the note goes to stderr
            where = "stdin" if args.batch == "-" else repr(args.batch)
            print(f"meshplan: {where} is empty: no request to answer (one JSON object per line).", file=sys.stderr)
    finally:
        if args.batch == "-":
            if source is not sys.stdin:
                source.detach()  # leave the process's stdin open
        else:
            source.close()
    return status


def _line_option(options: type[OptionsT], values: dict[str, Any], **flags: Any) -> OptionsT:
    """A batch line's options (recommend's top_k, min-gpus' max_gpus) taken out of its values, the request's fields
    left, validated by the model the MCP tool's schema is, in its words; a field the line leaves out takes the flag's
    value."""
    given = {name: values.pop(name) for name in options.model_fields if name in values}
    try:
        return options.model_validate({**flags, **given}, strict=True)
    except ValidationError as exc:
        raise request_error(exc) from None


def _request_command(run_name: str, table_name: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from meshplan.faces import display

        run = getattr(api, run_name)
        if getattr(args, "batch", None) is not None:
            return _batch(args, lambda values: run(parse_request(values)))
        if getattr(args, "config", None):  # check's fixes also in the file's keys; its misspelt keys warned of
            framework = args.framework or None
            result = run(request_from_args(args), config=api.import_file(args.config, framework=framework))
        else:
            result = run(request_from_args(args))
        _emit(result, args.json, getattr(display, table_name))
        if run_name == "check_config" and not result.ok:
            return EXIT_FINDINGS
        return EXIT_OK

    return command


def cmd_recommend(args: argparse.Namespace) -> int:
    from meshplan.faces import display

    top_k = RecommendOptions.model_validate({"top_k": args.top_k}, strict=True).top_k  # MCP's bounds and words
    if args.batch is not None:  # each line's top_k, as recommend_parallelism's argument, over --top-k
        def ranked(values: dict[str, Any]) -> Recommendation:
            line_top_k = _line_option(RecommendOptions, values, top_k=top_k).top_k  # taken out before the request
            return api.recommend(parse_request(values), top_k=line_top_k)

        return _batch(args, ranked, found_nothing=lambda rec: not rec.candidates)
    req = request_from_args(args)
    result = api.recommend(req, top_k=top_k)
    _emit(result, args.json, lambda rec: display.recommendation(rec, req))
    return EXIT_OK if result.candidates else EXIT_FINDINGS  # nothing ranked: the answer says why and what fits


def cmd_min_gpus(args: argparse.Namespace) -> int:
    """The smallest GPU count that fits (exit 1 when none does within the bounds), and the best layout there."""
    limit = MinimumGpusOptions.model_validate({"max_gpus": args.max_gpus}, strict=True).max_gpus  # MCP's bounds, words
    if args.batch is not None:  # each line's max_gpus, as minimum_gpus' argument, over --max-gpus
        def smallest(values: dict[str, Any]) -> MinimumGpus:
            line_limit = _line_option(MinimumGpusOptions, values, max_gpus=limit).max_gpus  # before the request
            return api.minimum_gpus(parse_request(values), max_gpus=line_limit)

        return _batch(args, smallest, found_nothing=lambda found: found.num_gpus is None)
    result = api.minimum_gpus(request_from_args(args, scan_gpus=True), max_gpus=limit)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        if result.num_gpus is not None:
            print(f"smallest GPU count: {result.num_gpus:,} x {result.gpu} (headroom {result.headroom:g})")
        else:
            print(f"no GPU count fits within the bounds (stopped by {result.stopped_by}; headroom {result.headroom:g})")
        if result.stopped_by in ("rules", "memory"):  # one count or none checked: its words say so (stepping)
            print(f"checked {result.stepping}")
        else:
            print(f"checked {plural(result.counts_checked, 'count')} from {result.searched_from:,} to "
                  f"{result.searched_to:,}: {result.stepping}")
        print(result.rationale)
        if result.warnings:  # recommend's for the same request, as its text face lists them
            print("warnings:\n" + "\n".join(f"  - {w}" for w in result.warnings))
        print("assumptions:\n" + "\n".join(f"  - {a}" for a in result.assumptions))
    return EXIT_OK if result.num_gpus is not None else EXIT_FINDINGS


def cmd_render(args: argparse.Namespace) -> int:
    """The snippet on stdout (pipe it to a file); its warnings and notes on stderr as comment lines.

    A layout that breaks a rule is refused with exit 1 and the findings with their fixes, unless --force.
    """
    from meshplan.adapters.render import TARGETS, RefusedLayout, require_target

    try:  # before the model: `render llama-3.1-8b --framework torchtitan` took the model for FRAMEWORK
        require_target(args.target)
    except MeshplanError as exc:
        if args.model_pos is not None or args.target in FRAMEWORKS or closest(args.target, TARGETS, n=1):
            raise
        if args.framework is not None and args.model is None:
            # recommend's "#1 as flags" line names the framework as --framework: the first argument is then the
            # model, and the framework is the one --framework gives (render refuses it itself if it renders none)
            args.target, args.model_pos = args.framework, args.target
            return cmd_render(args)
        order = f"FRAMEWORK comes first, then MODEL: meshplan render {args.framework or 'FRAMEWORK'} {args.target}."
        raise MeshplanError(exc.reason, fix=f"{order} {exc.fix}") from None
    req = request_from_args(args)
    if args.framework is not None and args.framework != args.target:
        raise MeshplanError(f"Two different frameworks given: FRAMEWORK {args.target!r} and --framework "
                            f"{args.framework!r}.", fix="Give the framework once, as the FRAMEWORK argument.")
    options = {k: v for k, v in {"variant": args.variant, "version": args.version}.items() if v is not None}
    try:
        result = api.render_config(args.target, req, force=args.force, **options)
    except RefusedLayout as exc:
        print(f"meshplan: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
    if args.json:
        print(result.model_dump_json(indent=2))
        return EXIT_OK
    print(result.text, end="" if result.text.endswith("\n") else "\n")
    for kind, lines in (("warning", result.warnings), ("note", result.notes)):
        for line in lines:
            print(f"# {kind}: {line}", file=sys.stderr)
    return EXIT_OK


def _listing_render_targets(base: type[argparse.HelpFormatter]) -> type[argparse.HelpFormatter]:
    """`base` that names the render targets in FRAMEWORK's help only when help is printed: listing them
    reads every framework card, which every other command would otherwise pay for at start-up."""

    class Formatter(base):  # type: ignore[valid-type, misc]
        def _get_help_string(self, action: argparse.Action) -> str:
            if action.dest != "target":
                return super()._get_help_string(action)
            return f"Framework to write the config for: {', '.join(renderable_frameworks())}"

    return Formatter


LINE_VALUE = 60  # the widest `field = value` the import listing aligns its sources after


def cmd_import(args: argparse.Namespace) -> int:
    """What the file states (field, value, its line and key), what it leaves to the framework, what meshplan cannot
    express or could not read; exit 0 (a file meshplan cannot read at all is an error, exit 2)."""
    imported = api.import_file(args.file, framework=args.framework, config_format=args.config_format)
    if args.json:
        print(imported.model_dump_json(indent=2))
        return EXIT_OK
    variant = f" ({imported.variant})" if imported.variant else ""
    print(f"{imported.path}: {imported.framework}{variant}")
    print("stated by the file:")
    widths = [len(f"{k} = {v}") for k, v in imported.request.items()]
    width = max((w for w in widths if w <= LINE_VALUE), default=0)  # a longer value (a flags model) is not padded to
    for name, value in imported.request.items():
        print(f"  {f'{name} = {value}':<{width}}  {imported.sources.get(name, '')}")
    defaults = [n for n in imported.notes if n.split(" = ", 1)[0] in imported.defaults]
    for title, lines in (("left to the framework's default:", defaults),
                         ("meshplan cannot express:", imported.unsupported),
                         ("not read (pass these as flags):", imported.unresolved),
                         ("assumed, as the file cannot settle it (pass a flag to change it):", imported.assumed),
                         ("notes:", [n for n in imported.notes if n not in defaults])):
        if lines:
            print(title)
            print("\n".join(f"  - {line}" for line in lines))
    left = dict.fromkeys(name for line in imported.left_to_request for name in line.fields)  # in the file's order
    needed = "".join(f" --{name.replace('_', '-')} {name.upper()}" for name in left)
    print(f"next: meshplan check --config {args.file}{needed} (flags beside --config override the file"
          + (f"; {', '.join(left)} the file does not state)" if left else ")"))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """The MCP server; it says on stderr what it waits for, and Ctrl-C ends it with status 130, no traceback."""
    with start_up():
        from meshplan.faces.mcp.server import chosen_transport, run

    run(transport=chosen_transport(args.transport, args.http), host=args.host, port=args.port,
        allowed_hosts=args.allowed_host, allow_server_files=args.allow_server_files)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """The plan's pictures: one offline HTML file (--html) and/or one SVG per picture (--svg DIR)."""
    from pathlib import Path

    from meshplan.faces import report

    if not args.html and not args.svg:
        raise MeshplanError("report needs somewhere to write.", fix="Add --html FILE.html and/or --svg DIR.")
    html, svg = (Path(args.html) if args.html else None), (Path(args.svg) if args.svg else None)
    _writable(html, svg)  # before the search, which a bad path would waste
    options = ReportOptions.model_validate({"recommend": args.recommend, "top_k": args.top_k}, strict=True)
    found = report.gather(request_from_args(args), recommend=options.recommend, top_k=options.top_k)
    try:
        if html is not None:
            html.write_text(report.render_html(found), encoding="utf-8")
            print(f"wrote {html}", file=sys.stderr)
        if svg is not None:
            for path in report.render_svgs(found, svg):
                print(f"wrote {path}", file=sys.stderr)
    except OSError as exc:
        raise MeshplanError(f"Cannot write the report to {exc.filename or html or svg}: {exc.strerror or exc}.",
                            fix="Pass --html a file and --svg a folder where you can write.") from None
    return EXIT_OK


def _writable(html: Any, svg: Any) -> None:
    """--html names a file in an existing folder, --svg a folder (made if absent): said before anything is computed,
    where the write raised a bare '[Errno 21] Is a directory' after the search."""
    if html is not None and (html.is_dir() or not html.parent.is_dir()):
        why = "is a folder" if html.is_dir() else f"is in {str(html.parent)!r}, which is not an existing folder"
        raise MeshplanError(f"--html {str(html)!r} {why}.", fix="Pass --html a file path in an existing folder, "
                                                               "e.g. --html plan.html.")
    if svg is not None and svg.exists() and not svg.is_dir():
        raise MeshplanError(f"--svg {str(svg)!r} is a file, not a folder.",
                            fix="Pass --svg a folder (it is made if absent): one SVG per picture is written there.")


def cmd_docs(args: argparse.Namespace) -> int:
    from meshplan.faces import docs

    drift = docs.render_all(check=args.check)
    pages = plural(len(docs.skill_pages()), "skill page")
    if args.check and drift:
        for path in drift:
            print(f"out of date with its sources: {path} (run 'meshplan docs')", file=sys.stderr)
        print(f"checked {pages} under skills/ against the cards and the MCP tool list against the tools: "
              f"{len(drift):,} out of date", file=sys.stderr)
        return EXIT_FINDINGS
    if args.check:
        print(f"checked {pages} under skills/ against the cards and the MCP tool list against the tools: every "
              "generated file is up to date")
    else:
        print(f"rendered the generated tables of {pages} under skills/ from the cards and the MCP tool list from the "
              "tools: "
              + (f"{len(drift):,} rewritten ({', '.join(drift)})" if drift else "all were up to date"))
    return EXIT_OK


# --------------------------------------------------------------------------- parser


def add_report_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="Draw the plan: memory per stage, mesh, schedule, step time (HTML/SVG)")
    add_request_flags(p)
    p.add_argument("--html", metavar="FILE", help="Write one self-contained, offline HTML file")
    p.add_argument("--svg", metavar="DIR", help="Write each picture as DIR/<name>.svg")
    p.add_argument("--recommend", action="store_true",
                   help="Search first (as `meshplan recommend`) and draw the best layout and the candidates")
    p.add_argument("--top-k", type=_typed(ascii_int), default=5, help="With --recommend: how many layouts to compare")
    p.set_defaults(func=cmd_report)


def add_import_parser(sub: Any) -> None:
    """`meshplan import FILE`: the request a framework config or launch script states."""
    p = sub.add_parser("import", help="Read a framework config or launch script into meshplan's request "
                                      "(field by field, with the file's key and line; nothing is run)")
    p.add_argument("file", metavar="FILE", help="Launch script (.sh), TOML job file, DeepSpeed JSON config or NeMo "
                                                "AutoModel recipe YAML")
    p.add_argument("--framework", default=None, choices=list(FRAMEWORKS),  # a misspelt name gets the near one,
                   help="The framework the file is for (default: detected)")  # as every other --framework does
    p.add_argument("--format", dest="config_format", choices=["shell", "toml", "json", "yaml"], default=None,
                   help="The file's format (default: from its name and content)")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_import)


def cmd_compare(args: argparse.Namespace) -> int:
    """Predicted vs measured for a config and its run's log; with --calibrate, the step-time factor is stored."""
    from meshplan.faces import display

    text = api.log_file_text(args.log)
    result = api.compare_run(request_from_args(args), text, log_path=args.log, calibrate=args.calibrate)
    _emit(result, args.json, display.comparison)
    return EXIT_OK


def add_compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="Compare a run's log (peak memory, step time, tokens/s, MFU) with meshplan's "
                                       "prediction for its config, within the error band of its regime")
    add_request_flags(p)
    p.add_argument("--log", metavar="LOG", required=True,
                   help="The run's training log (Megatron-LM/Core/Bridge, Megatron-DeepSpeed, DeepSpeed, torchtitan, "
                        "verl, SkyRL, KempnerForge stdout)")
    p.add_argument("--calibrate", action="store_true",
                   help="Store measured / predicted step time as this cluster's factor (MESHPLAN_CLUSTER, GPU, "
                        "framework) in $MESHPLAN_CALIBRATION_FILE or ~/.config/meshplan/calibration.json; every "
                        "throughput answer then applies it and says so (default: store nothing)")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_compare)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="meshplan",
        description="Plan and check the parallel layout (TP/PP/CP/EP/DP) of an LLM training job.",
    )
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")  # subparsers are Parsers too

    p = sub.add_parser("describe", help="Parameter counts of a model, exact from its config")
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help=Request.model_fields["model"].description)
    p.add_argument("--model", default=None, help="Same as MODEL (required: this or MODEL)")
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
        p.add_argument("--batch", metavar="FILE.jsonl",
                       help=BATCH_HELP + (", 1 if a check finds an error" if name == "check" else ""))
        p.set_defaults(func=_request_command(run, table))

    p = sub.add_parser("recommend",
                       help="Search every valid layout and rank those that fit by speed (exit 1 when none fits)")
    add_request_flags(p)
    p.add_argument("--top-k", type=_typed(ascii_int), default=5, help="How many layouts to return")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.add_argument("--batch", metavar="FILE.jsonl", help=BATCH_HELP + ' (a line\'s "top_k" over --top-k); exit 1 if '
                                                         "a line ranks no layout")
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("min-gpus", help="The smallest GPU count where a layout fits with the headroom (exit 1: none)")
    add_request_flags(p)
    for action in p._actions:  # the count is the answer here, not an input
        if action.dest == "num_gpus":
            action.help = argparse.SUPPRESS
    p.add_argument("--max-gpus", type=_typed(ascii_int), default=None, metavar="N",
                   help="Largest GPU count to check (default: cards/search.yaml min_gpus_search_limit, 1,048,576)")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.add_argument("--batch", metavar="FILE.jsonl", help=BATCH_HELP + ' (a line\'s "max_gpus" over --max-gpus); exit '
                                                         "1 if a line finds no GPU count")
    p.set_defaults(func=cmd_min_gpus)

    p = sub.add_parser("render", help="Emit the plan as a framework config snippet (refused if it breaks a rule)")
    p.formatter_class = _listing_render_targets(p.formatter_class)
    p.add_argument("target", metavar="FRAMEWORK", help="Framework to write the config for")
    add_request_flags(p)  # FRAMEWORK MODEL [flags]
    p.add_argument("--variant", default=None, help="Framework-specific form (e.g. verl: megatron|fsdp; skyrl: rl|sft)")
    p.add_argument("--version", default=None, help="Framework version to target (e.g. torchtitan 0.2)")
    p.add_argument("--force", action="store_true",
                   help="Render even when the layout breaks a rule (the findings are printed as warnings)")
    p.add_argument("--json", action="store_true", help="Print the structured result")
    p.set_defaults(func=cmd_render)

    add_report_parser(sub)

    p = sub.add_parser("serve", help="Run the MCP server (stdio by default)")
    p.add_argument("--transport", choices=["stdio", "http"], default=None,
                   help="stdio for a host that starts the server; http serves http://HOST:PORT/mcp (default: stdio)")
    p.add_argument("--http", action="store_true",
                   help="The same as --transport http: the MCP server at /mcp and the planner's web page at / "
                        "(default: off, the --transport given)")
    p.add_argument("--host", default=None, help="HTTP bind address (default: 127.0.0.1, loopback unless told "
                                                "otherwise)")
    p.add_argument("--port", type=_typed(ascii_int), default=None, help="HTTP port (default: 8765)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="Extra Host header to accept over HTTP when binding beyond loopback (repeatable; "
                        "default: loopback names only)")
    p.add_argument("--allow-server-files", action="append", default=[], metavar="DIR", help=ALLOW_SERVER_FILES_HELP)
    p.set_defaults(func=cmd_serve)

    add_import_parser(sub)
    add_compare_parser(sub)

    p = sub.add_parser("docs", help="Render the skill tables and the MCP tool list from their sources (--check: drift)")
    p.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a generated file is out of date")
    p.set_defaults(func=cmd_docs)
    return parser


def _silence_stdout() -> None:
    """Point stdout at /dev/null once its reader has closed the pipe: Python flushes stdout again at exit, and that
    second write would print 'Exception ignored ... BrokenPipeError' (the Python documentation's signal note)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO or a closed stream: nothing is flushed at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValidationError as exc:
        print(f"meshplan: {request_error(exc)}", file=sys.stderr)
    except MeshplanError as exc:
        print(f"meshplan: {exc}", file=sys.stderr)
    except BrokenPipeError:  # `meshplan recommend ... | head`: the reader has what it wanted; nothing to say
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        print(f"meshplan: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("meshplan: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
